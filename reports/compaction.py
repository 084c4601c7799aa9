"""Compaction: many export batches of a table become one, holding only each row's
latest version, so that reading the dataset stays one scan without a shuffle.

Every report run exports first, so batches accumulate (a busy day makes hundreds);
each costs a file listing, and several mean deduplicating rows across them. Once a
table has more than COMPACT_AFTER batches, Spark rewrites them as one batch named
after the newest, which the export's watermark already covers.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from reports.dataset import TABLES, batches
from reports.export import export_lock
from reports.spark import Dataset

COMPACT_AFTER = 16


def compact_dataset(spark, root: Path, *, at_least: int = COMPACT_AFTER) -> dict[str, int]:
    """Compact every incremental table of the dataset at `root` with more than
    `at_least` batches; return how many batches were merged, per table compacted."""
    merged = {}
    with export_lock():
        for name, table in TABLES.items():
            folder = root / name
            old = batches(folder)
            if table.incremental and len(old) > at_least:
                _rewrite(Dataset(spark, root).table(name), folder, old)
                merged[name] = len(old)
    return merged


def _rewrite(latest_rows, folder: Path, old: list[Path]) -> None:
    staged = folder / f".compacting-{time.time_ns()}"
    latest_rows.write.parquet(str(staged), compression="zstd")
    retired = folder / f".retired-{time.time_ns()}"
    retired.mkdir()
    for batch in old:
        batch.rename(retired / batch.name)
    staged.rename(old[-1])  # the newest batch's name: nothing newer is lost
    shutil.rmtree(retired, ignore_errors=True)
