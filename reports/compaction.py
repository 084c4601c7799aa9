"""Compaction: many export batches of a table become one, holding only each row's
latest version, so that reading the dataset stays one scan without a shuffle.

Every report run exports first, so batches accumulate (a busy day makes hundreds);
each costs a file listing, and several mean deduplicating rows across them. Once a
table has more than COMPACT_AFTER batches, Spark rewrites them as one batch named
after the newest, which the export's watermark already covers.

A compaction stopped part way (the worker killed) loses nothing: the new batch is
written beside the old ones first (`.compacting-T`), then the old ones move aside
(`.retired-T`, the same T) and it takes the newest one's name. What a stop leaves is
put right, under the export's lock, before the dataset is next read or compacted
(finish_interrupted): the old batches moved back if the new one is not in place yet,
else let go.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from reports.dataset import TABLES, batches
from reports.export import export_lock
from reports.spark import Dataset

COMPACT_AFTER = 16
STAGED, RETIRED = ".compacting-", ".retired-"


def compact_dataset(spark, root: Path, *, at_least: int = COMPACT_AFTER) -> dict[str, int]:
    """Compact every incremental table of the dataset at `root` with more than
    `at_least` batches; return how many batches were merged, per table compacted."""
    merged = {}
    with export_lock():
        _put_right(root)
        for name, table in TABLES.items():
            folder = root / name
            old = batches(folder)
            if table.incremental and len(old) > at_least:
                _rewrite(Dataset(spark, root).table(name), folder, old)
                merged[name] = len(old)
    return merged


def finish_interrupted(root: Path) -> None:
    """Put right what compactions stopped part way left in the dataset at `root`
    (see the module's docstring), so that a reading finds every row."""
    with export_lock():
        _put_right(root)


def _rewrite(latest_rows, folder: Path, old: list[Path]) -> None:
    token = time.time_ns()
    staged, retired = folder / f"{STAGED}{token}", folder / f"{RETIRED}{token}"
    latest_rows.write.parquet(str(staged), compression="zstd")
    retired.mkdir()
    for batch in old:
        batch.rename(retired / batch.name)
    staged.rename(old[-1])  # the newest batch's name: nothing newer is lost
    shutil.rmtree(retired, ignore_errors=True)  # what is left, the next one lets go


def _put_right(root: Path) -> None:
    for name, table in TABLES.items():
        if table.incremental and (root / name).is_dir():
            _put_right_folder(root / name)


def _put_right_folder(folder: Path) -> None:
    """Each compaction's leftovers in `folder`: old batches moved aside while the new
    one is still staged go back (the compaction is undone, and comes again); old
    batches moved aside once it took their place are let go; a staged batch with
    nothing moved aside (its writing stopped) too."""
    for retired in sorted(folder.glob(f"{RETIRED}*")):
        staged = folder / (STAGED + retired.name.removeprefix(RETIRED))
        if staged.exists():
            for batch in sorted(retired.iterdir()):
                if not (folder / batch.name).exists():
                    batch.rename(folder / batch.name)
        shutil.rmtree(retired)
    for staged in folder.glob(f"{STAGED}*"):
        shutil.rmtree(staged)
