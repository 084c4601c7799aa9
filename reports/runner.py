"""Running one report, start to end, in the reports worker: export what changed, find
the warm Spark session, run the job while its progress is written, store the result.

Progress is kept in memory by the job's threads and written by one heartbeat thread
every second, so that a long COPY or a long Spark stage still shows the run alive.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback

from django.db import connections

from reports import services, spark
from reports.compaction import compact_dataset, finish_interrupted
from reports.export import dataset_root, export_changes
from reports.jobs import KINDS, job, keep_derived, rehearsals, rehearse
from reports.results import Params, Result

logger = logging.getLogger(__name__)
HEARTBEAT_S = 1.0
# The worker's warm-up reads the dataset while the first run may start: that run's
# export and compaction (which replace folders) wait until it has read it.
_dataset_in_use = threading.Lock()

# How much of the bar each step fills: the export, Spark's start, the job, the storing.
EXPORT_PART = (0.0, 0.2)
STARTUP_PART = (0.2, 0.3)
JOB_PART = (0.3, 0.95)


def run_report(run_id: int) -> None:
    """Run the report `run_id` unless it is finished or running elsewhere. Its error,
    if any, is stored with it (never raised: the task has nothing to retry)."""
    run = services.claim_run(run_id)
    if run is None:
        return
    with Heartbeat(run_id) as beat:
        try:
            _run(run, beat)
        except Exception as error:
            logger.exception("report %s failed", run_id)
            services.fail_run(run_id=run_id, error=describe_error(error))


def _run(run, beat: Heartbeat) -> None:
    timings: dict[str, float] = {}
    if _dataset_in_use.locked():
        beat.set("waiting while the worker reads the dataset into memory", EXPORT_PART[0])
    with _dataset_in_use:  # not while the worker's warm-up reads it
        export = export_changes(progress=beat.within(*EXPORT_PART))
        timings["export"] = export.seconds
        beat.set("starting Spark" if not spark.is_warm() else "Spark is warm", STARTUP_PART[0])
        timings["startup"] = spark.warm_up()
        beat.set("compacting the dataset", STARTUP_PART[1])
        compact_dataset(spark.session(), dataset_root())
    started = time.monotonic()
    with spark.ProgressWatcher(spark.session(), beat.within(*JOB_PART)):
        result = compute(run.kind, services.params_of(run))
    timings["job"] = time.monotonic() - started
    beat.set("storing the results", JOB_PART[1])
    services.store_result(
        run_id=run.pk,
        result=result,
        data_as_of=export.at,
        timings=timings,
        spark_master=spark.session().sparkContext.master,
    )


def warm_up() -> float:
    """Start Spark and read the exported dataset into memory, as the reports worker
    does as it starts: its first report then waits for neither; then rehearse every
    report (reports.jobs.rehearse), so that its first run compiles no code. The
    seconds it took (0 when the session was already started)."""
    if spark.is_warm():
        return 0.0
    started = time.monotonic()
    with _dataset_in_use:
        spark.warm_up()
        runs = _read_dataset()
    # After the dataset is read, a report at a time: a run asked meanwhile waits for
    # one report's rehearsal, not all; and its export and compaction, which replace
    # the files a rehearsal may read, never run during one.
    for kind in KINDS if runs else ():
        with _dataset_in_use:
            rehearse(_kept_dataset(), (kind,), runs)  # as the last run's export left it
    return time.monotonic() - started


def _read_dataset() -> list[Params]:
    """The dataset, if one was exported, put right (a compaction the last worker left
    part way) and kept; the runs its rehearsal makes (none without a dataset)."""
    data = _kept_dataset()
    if not data.root.is_dir():
        return []
    finish_interrupted(data.root)
    keep_dataset()
    return rehearsals(data)


def keep_dataset() -> None:
    """Keep the frames the jobs derive from the dataset's tables (the deliveries
    joined with their receivers, the hops with the hop before...), and the tables
    they read, in the session's memory (reports.kept), if a dataset was exported. A
    table that queries read only through frames derived from it row by row (the
    deliveries, the audit) is not kept itself (see reports.kept._whole_table)."""
    data = _kept_dataset()
    if data.root.is_dir():
        keep_derived(data)


def compute(kind: str, params: Params) -> Result:
    """The report `kind` over the dataset, in this process's warm session, as a run
    computes it (the benchmark times this)."""
    return job(kind).run(_kept_dataset(), params)


def _kept_dataset() -> spark.Dataset:
    """The dataset in this process's warm session, its tables kept in memory."""
    return spark.Dataset(spark.session(), dataset_root(), keep=True)


def describe_error(error: BaseException) -> str:
    """The error for the page: what it is first, then where (the innermost frames)."""
    first_line = f"{type(error).__name__}: {error}".strip()
    frames = traceback.format_exception(error)[-6:]
    return first_line + "\n\n" + "".join(frames)


class Heartbeat:
    """Holds a run's latest stage and fraction, and writes them (with the heartbeat)
    every HEARTBEAT_S from its own thread and database connection."""

    def __init__(self, run_id: int) -> None:
        self.run_id = run_id
        self.stage, self.fraction = "starting", 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True, name="report-heartbeat")

    def set(self, stage: str, fraction: float) -> None:
        self.stage, self.fraction = stage, fraction

    def within(self, low: float, high: float):
        """A progress callback whose 0..1 fills [low, high] of the whole bar."""
        return lambda stage, fraction: self.set(stage, low + (high - low) * fraction)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *_) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _beat(self) -> None:
        try:
            while not self._stop.wait(HEARTBEAT_S):
                services.record_progress(
                    run_id=self.run_id, stage=self.stage, fraction=self.fraction
                )
        except Exception:
            logger.exception("the heartbeat of report %s stopped", self.run_id)
        finally:
            connections.close_all()  # this thread's own connections
