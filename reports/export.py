"""The incremental export: bring the Parquet dataset up to date with PostgreSQL.

One REPEATABLE READ transaction reads, for every incremental table, the rows written by
transactions between the table's watermark and the snapshot's xmin, and every snapshot
table whole; then it moves the watermarks to that xmin (docs/reports.md, "Watermarks").
Rows leave PostgreSQL through COPY as CSV and become Parquet through pyarrow's streaming
reader, a batch of rows at a time, so that ten million rows never sit in memory.
"""

from __future__ import annotations

import filecmp
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
from django.conf import settings
from django.db import connection, transaction

from reports.dataset import LAYOUT, LAYOUT_FILE, TABLES, Table, batches, in_current_layout
from reports.models import ExportWatermark

# Only one export at a time writes the dataset (PostgreSQL advisory lock key).
EXPORT_LOCK = 0x5E1EC7
BLOCK_BYTES = 16 * 1024 * 1024  # of CSV text per Parquet row group, about 150,000 rows

Progress = Callable[[str, float], None]


@dataclass
class ExportResult:
    """What one export wrote: row versions per table, the watermark reached, when."""

    watermark: int
    at: datetime
    rows: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0


def dataset_root() -> Path:
    """Where the dataset lives (REPORTS_DATASET)."""
    return Path(settings.REPORTS_DATASET)


def export_changes(*, progress: Progress | None = None) -> ExportResult:
    """Export what changed since the last export, and every snapshot table.

    Safe to run at any time and from several workers: exports take turns, and a batch
    written again (after a crash before its watermark was saved) replaces itself.
    """
    started = time.monotonic()
    root = dataset_root()
    with export_lock():
        _forget_another_databases_rows(root)
        _start_again_on_another_layout(root)
        with transaction.atomic():
            result = _export_in_snapshot(root, progress or _silent)
    result.seconds = time.monotonic() - started
    return result


def _forget_another_databases_rows(root: Path) -> None:
    """With no watermark, the database is new (or was emptied): files already in the
    dataset were exported from something else and would be counted with its rows."""
    if root.exists() and not ExportWatermark.objects.exists():
        _empty(root)


def _empty(root: Path) -> None:
    for child in root.iterdir():
        shutil.rmtree(child) if child.is_dir() else child.unlink()


def _start_again_on_another_layout(root: Path) -> None:
    """A dataset written in another layout (reports.dataset.LAYOUT: a column added,
    say) is exported again from the start, rather than read as files of two layouts
    (the new column null in the old ones). The watermarks go first: a crash between the
    two leaves files without watermarks, which the next export clears."""
    if in_current_layout(root):
        return
    # Also when the folder is gone or empty (removed, or REPORTS_DATASET moved): the
    # watermarks would have the export write only what changed since, and the reports
    # would read nothing older.
    ExportWatermark.objects.all().delete()
    if root.exists():
        _empty(root)
    root.mkdir(parents=True, exist_ok=True)
    (root / LAYOUT_FILE).write_text(f"{LAYOUT}\n")


def _silent(stage: str, fraction: float) -> None:
    pass


class export_lock:
    """A session-level advisory lock taken before the export's transaction begins, so
    that the snapshot of the second of two exports sees the first one's watermarks."""

    def __enter__(self) -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_lock(%s)", [EXPORT_LOCK])

    def __exit__(self, *_) -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s)", [EXPORT_LOCK])


def _export_in_snapshot(root: Path, progress: Progress) -> ExportResult:
    with connection.cursor() as cursor:
        # First statement of the transaction: every later read sees one snapshot.
        cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        cursor.execute("SET LOCAL TimeZone = 'UTC'")
        cursor.execute("SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint, now()")
        xmin, now = cursor.fetchone()
    result = ExportResult(watermark=xmin, at=now)
    tables = list(TABLES.values())
    for index, table in enumerate(tables):
        progress(f"exporting {table.name}", index / len(tables))
        result.rows[table.name] = _export_table(table, root, xmin=xmin, now=now)
    return result


def _export_table(table: Table, root: Path, *, xmin: int, now: datetime) -> int:
    if not table.incremental:
        # In a fixed order: a table exported again unchanged is the same file (kept).
        query = f"{_select(table)} ORDER BY 1"
        return _write_parquet(query, root / table.name, "part-0.parquet", table)
    mark, _ = ExportWatermark.objects.select_for_update().get_or_create(table=table.name)
    if mark.batches and not batches(root / table.name):
        mark.txid = mark.batches = mark.rows = 0  # its files are gone: from the start again
    rows = 0
    if xmin > mark.txid:
        query = _select(table, since=mark.txid, below=xmin)
        rows = _write_parquet(query, root / table.name / f"batch={xmin}", "part-0.parquet", table)
        mark.batches += 1 if rows else 0
    mark.txid = max(mark.txid, xmin)
    mark.rows += rows
    mark.exported_at = now
    mark.save()
    return rows


def _select(table: Table, *, since: int | None = None, below: int | None = None) -> str:
    columns = ", ".join(column.sql for column in table.columns)
    query = f"SELECT {columns} FROM {table.source} WHERE {table.kept}"
    if since is not None:
        txid = next(c.sql for c in table.columns if c.name == "txid")
        query += f" AND {txid} >= {int(since)} AND {txid} < {int(below)}"
    return query


def _write_parquet(query: str, folder: Path, name: str, table: Table) -> int:
    """COPY `query` out as CSV and write it to `folder/name` as Parquet, replacing the
    folder whole and at once; an empty result writes nothing, nor does a file the same
    as the one there. Returns the rows."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder.parent, prefix=".export-") as scratch:
        csv_path = Path(scratch) / "rows.csv"
        _copy_out(query, csv_path)
        staged = Path(scratch) / "out"
        staged.mkdir()
        rows = _csv_to_parquet(csv_path, staged / name, table)
        if _unchanged(staged / name, folder / name):
            return rows
        if rows or not table.incremental:
            _replace_folder(staged, folder)
    return rows


def _unchanged(staged: Path, written: Path) -> bool:
    """Whether the file staged holds the same bytes as the one written before, which is
    then left as it is: a warm session keeps what it read of it (reports.kept)."""
    return written.exists() and filecmp.cmp(staged, written, shallow=False)


def _copy_out(query: str, path: Path) -> None:
    statement = f"COPY ({query}) TO STDOUT WITH (FORMAT csv)"
    with (
        connection.cursor() as cursor,
        open(path, "wb") as out,
        cursor.cursor.copy(statement) as copy,
    ):
        for block in copy:
            out.write(block)


def _csv_to_parquet(csv_path: Path, parquet_path: Path, table: Table) -> int:
    if csv_path.stat().st_size == 0:
        # Nothing changed (pyarrow refuses an empty CSV): an empty file of the schema.
        pq.write_table(table.schema.empty_table(), parquet_path, compression="zstd")
        return 0
    # Times arrive as microseconds since the epoch; everything else as its own type.
    read_types = {c.name: (pa.int64() if c.is_time else c.type) for c in table.columns}
    rows = 0
    with (
        pa_csv.open_csv(
            csv_path,
            read_options=pa_csv.ReadOptions(
                column_names=table.column_names, block_size=BLOCK_BYTES
            ),
            parse_options=pa_csv.ParseOptions(newlines_in_values=True),
            convert_options=pa_csv.ConvertOptions(
                column_types=read_types,
                strings_can_be_null=True,
                quoted_strings_can_be_null=False,
                true_values=["t"],
                false_values=["f"],  # how PostgreSQL writes booleans
            ),
        ) as reader,
        pq.ParquetWriter(parquet_path, table.schema, compression="zstd") as writer,
    ):
        for batch in reader:
            writer.write_batch(_typed(batch, table))
            rows += batch.num_rows
    return rows


def _typed(batch: pa.RecordBatch, table: Table) -> pa.RecordBatch:
    arrays = [
        batch.column(i).cast(column.type) if column.is_time else batch.column(i)
        for i, column in enumerate(table.columns)
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=table.schema)


def _replace_folder(staged: Path, folder: Path) -> None:
    """Put `staged` where `folder` is: readers see the old folder or the new one."""
    if folder.exists():
        retired = folder.with_name(f".retired-{folder.name}-{os.getpid()}-{time.time_ns()}")
        folder.rename(retired)
        staged.rename(folder)
        shutil.rmtree(retired, ignore_errors=True)
    else:
        staged.rename(folder)


def freshness() -> dict[str, datetime | None]:
    """When each incremental table was last exported (None: never)."""
    marks = dict(ExportWatermark.objects.values_list("table", "exported_at"))
    return {name: marks.get(name) for name, t in TABLES.items() if t.incremental}


def oldest_export() -> datetime | None:
    """How fresh the whole dataset is: its least recently exported table's export."""
    times = list(freshness().values())
    return None if not times or None in times else min(times)
