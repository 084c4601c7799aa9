"""One SparkSession per process, kept warm between reports, and the dataset as Spark
DataFrames.

Spark's start-up (a JVM, then the session) costs seconds; the reports worker pays it
once, when it starts, and every report after that finds the session ready.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from django.conf import settings

from reports.dataset import TABLES, batches
from reports.kept import (
    kept_derived,
    kept_derived_by_key,
    kept_derived_rows,
    kept_rows,
    kept_table,
)

# Classes of generated code kept: every report's, with room for several windows.
CODEGEN_CACHE_ENTRIES = 1000

_session = None
_session_lock = threading.Lock()


def session():
    """The process's SparkSession, started on first use (SPARK_MASTER, local[*] by
    default)."""
    global _session
    with _session_lock:
        if _session is None:
            _session = _build_session()
        return _session


def is_warm() -> bool:
    """Whether this process's session is already started."""
    return _session is not None


def warm_up() -> float:
    """Start the session now (a worker does it as it starts); return the seconds it took,
    0 if it was already running."""
    if is_warm():
        return 0.0
    started = time.monotonic()
    session()
    return time.monotonic() - started


def _build_session():
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    # py4j says INFO when its connections close, even at interpreter exit, after the
    # log's streams are closed (a "Logging error" on every exit).
    logging.getLogger("py4j").setLevel(logging.WARNING)

    conf = SparkConf().setMaster(settings.SPARK_MASTER).setAppName(APP_NAME)
    conf.setAll(_configuration().items())
    # The context on a JVM started here, whose output goes where SPARK_LOG_FILE says;
    # the session then takes it.
    SparkContext(conf=conf, gateway=_gateway(conf))
    spark = SparkSession.builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


APP_NAME = "selective-notification-reports"


def _configuration() -> dict[str, str]:
    return {
        "spark.driver.memory": settings.SPARK_DRIVER_MEMORY,
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.enabled": "false",
        # The console's progress bar on stderr: the run's own progress is on its page.
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": str(_shuffle_partitions()),
        "spark.sql.adaptive.enabled": str(not _is_local()).lower(),
        # A batch is often one file of a few row groups: splits of 8 MB (not 128) let
        # every core read a part of it, without a shuffle to spread it.
        "spark.sql.files.maxPartitionBytes": "8m" if _is_local() else "128m",
        # Compiled code is cached by its text; Spark keeps 100 classes, fewer than one
        # audit report compiles (about 130): each run compiled them all again (4 s).
        "spark.sql.codegen.cache.maxEntries": str(CODEGEN_CACHE_ENTRIES),
    }


def _gateway(conf):
    """Spark's JVM, started for `conf`. Its own lines (its start-up, its log: nothing
    of a report's failure, which reaches the run as an exception) are appended to
    SPARK_LOG_FILE when it is set, and the JVM's children write there too; otherwise
    they go to this process's output."""
    from pyspark.java_gateway import launch_gateway

    if not settings.SPARK_LOG_FILE:
        return launch_gateway(conf)
    with open(settings.SPARK_LOG_FILE, "ab") as log:
        return launch_gateway(conf, popen_kwargs={"stdout": log, "stderr": log})


def _shuffle_partitions() -> int:
    # Spark's default of 200 shuffle partitions is made for big clusters; on one
    # machine one per core does better (SPARK_SHUFFLE_PARTITIONS chooses).
    if settings.SPARK_SHUFFLE_PARTITIONS:
        return settings.SPARK_SHUFFLE_PARTITIONS
    if _is_local():
        return _local_cores()
    return 200


def _is_local() -> bool:
    """Whether Spark runs in this process's JVM (local[...]). There, adaptive query
    execution is off: re-planning every stage cost 0.1 to 0.2 s per query on two cores,
    more than it saved on data of one machine; a cluster keeps it (it coalesces the
    200 partitions and splits skewed ones)."""
    return settings.SPARK_MASTER.startswith("local")


def _local_cores() -> int:
    threads = settings.SPARK_MASTER.removeprefix("local").strip("[]").split(",")[0]
    return int(threads) if threads.isdigit() else os.cpu_count() or 1


class Dataset:
    """The dataset's tables as DataFrames: per id the latest row version only. With
    `keep`, tables are kept in the session's memory between Datasets (reports.kept),
    as the reports worker reads them."""

    def __init__(self, spark, root: Path, *, keep: bool = False) -> None:
        self.spark = spark
        self.root = Path(root)
        self.keep = keep
        self._frames: dict = {}

    def table(self, name: str):
        """The table `name` (see reports.dataset.TABLES), read once per Dataset."""
        if name not in self._frames:
            self._frames[name] = kept_table(self, name) if self.keep else self.read(name)
        return self._frames[name]

    def rows(self, name: str) -> list:
        """The rows of the small table `name`; with `keep`, collected once per version
        of its folder (reports.kept.kept_rows)."""
        return kept_rows(self, name) if self.keep else self.table(name).collect()

    def derived(self, name: str, sources: tuple[str, ...], build: Callable):
        """The frame `build()` computes from the tables `sources`, once per Dataset;
        with `keep`, kept in memory between Datasets until one of those tables changes."""
        if self.keep:
            return self._once(name, lambda: kept_derived(self, name, sources, build))
        return self._once(name, build)

    def derived_rows(self, name: str, table: str, looked_up: tuple[str, ...], build: Callable):
        """The frame `build(rows)` computes row by row from rows of `table` (each row
        gives at most one, with its `id`), looking up the tables `looked_up`, once per
        Dataset; with `keep`, kept in memory and brought up to date from new batches
        only (reports.kept.kept_derived_rows)."""
        if self.keep:
            return self._once(name, lambda: kept_derived_rows(self, name, table, looked_up, build))
        return self._once(name, lambda: build(self.table(table)))

    def derived_by_key(
        self, name: str, table: str, key: str, looked_up: tuple[str, ...], build: Callable
    ):
        """The frame `build(keys)` computes per value of the column `key` of `table`
        (for the keys of the frame `keys`, every key when None), looking up the tables
        `looked_up`, once per Dataset; with `keep`, kept in memory and built again for
        the keys an export's new batches hold only (reports.kept.kept_derived_by_key)."""
        if self.keep:
            return self._once(
                name, lambda: kept_derived_by_key(self, name, table, key, looked_up, build)
            )
        return self._once(name, lambda: build(None))

    def _once(self, name: str, compute: Callable):
        """A derived frame `name`, computed by `compute()` once per Dataset."""
        if name in TABLES:
            raise ValueError(f"a derived frame cannot be named as the table {name!r} is")
        if name not in self._frames:
            self._frames[name] = compute()
        return self._frames[name]

    def read(self, name: str, *, only: list[Path] | None = None):
        """The table `name` read from its files now (`only` these batches of it)."""
        table = TABLES[name]
        folder = self.root / name
        if not _has_parquet(folder):
            return small_frame(self.spark, [], _spark_schema(table))
        paths = [str(path) for path in only] if only else [str(folder)]
        reader = self.spark.read.schema(_spark_schema(table)).option("basePath", str(folder))
        frame = reader.parquet(*paths)
        if table.incremental and len(only or batches(folder)) > 1:
            frame = _latest_versions(frame)
        return frame.select(*table.column_names)


def small_frame(spark, rows: list[tuple], schema):
    """A DataFrame of a few `rows` made on the driver (`schema`: a StructType, or DDL
    text as createDataFrame takes it), sent to Spark as Arrow and held in the plan
    itself. createDataFrame of a Python list makes an RDD of pickles instead, which every
    query over it unpickles in Python workers: 0.1 to 0.3 s a query, for a few rows."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructType, _parse_datatype_string

    struct = schema if isinstance(schema, StructType) else _parse_datatype_string(schema)
    arrow = to_arrow_schema(struct, timezone="UTC")
    columns = list(zip(*rows, strict=True)) if rows else [[] for _ in struct.fields]
    arrays = [pa.array(values, field.type) for values, field in zip(columns, arrow, strict=True)]
    return spark.createDataFrame(pa.Table.from_arrays(arrays, schema=arrow), struct)


def _has_parquet(folder: Path) -> bool:
    return folder.is_dir() and any(folder.rglob("*.parquet"))


def _latest_versions(frame):
    """A row changed after it was first exported is in several batches: keep the
    version the latest transaction wrote."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    newest_first = Window.partitionBy("id").orderBy(F.col("txid").desc())
    ranked = frame.withColumn("_rank", F.row_number().over(newest_first))
    return ranked.where(F.col("_rank") == 1).drop("_rank")


def _spark_schema(table):
    from pyspark.sql import types as T

    kinds = {
        "string": T.StringType(),
        "int64": T.LongType(),
        "bool": T.BooleanType(),
        "timestamp[us, tz=UTC]": T.TimestampType(),
    }
    return T.StructType(
        [T.StructField(c.name, kinds[str(c.type)], nullable=True) for c in table.columns]
    )


class ProgressWatcher:
    """While a job runs, report Spark's progress (finished tasks of the stages so far)
    every `interval` seconds through `report(stage, fraction)`."""

    def __init__(self, spark, report: Callable[[str, float], None], interval: float = 1.0):
        self.tracker = spark.sparkContext.statusTracker()
        self.report = report
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="report-progress")

    def __enter__(self) -> ProgressWatcher:
        self._thread.start()
        return self

    def __exit__(self, *_) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            stage, fraction = self._snapshot()
            self.report(stage, fraction)

    def _snapshot(self) -> tuple[str, float]:
        done = total = 0
        for stage_id in self.tracker.getActiveStageIds():
            info = self.tracker.getStageInfo(stage_id)
            if info is not None:
                done += info.numCompletedTasks
                total += info.numTasks
        if not total:
            return "running Spark job", 0.0
        return f"Spark: {done} of {total} tasks", done / total
