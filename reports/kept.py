"""The dataset's tables kept in the warm session's memory between report runs, so that
a run reads memory, not files: the second report of a session, or the same report
with another window or region, pays for its query and not for reading and
deduplicating Parquet again.

A kept table is brought up to date before each run, from the folder alone:
- nothing changed (same batches, same files): the kept frame as it is;
- new batches since (an export): only they are read, and the kept rows they replace
  (same id, a newer row version) are left out of the kept ones;
- anything else (a compaction rewrote the batches, a batch was rewritten, a snapshot
  table was exported again): the table is read whole again.

A frame derived from tables (kept_derived: the deliveries with their receivers, which
three reports join alike at every query) is kept the same way, and computed again
whenever one of its tables changed. A frame derived row by row from one table
(kept_derived_rows: each delivery with its receiver, each audit entry with what its
details say) is brought up to date as a table is: from the new batches only. A frame
derived per key of one table (kept_derived_by_key: the reach's tallies per event) is
built again for the keys the new batches hold only.

An export's changes are kept apart from the frame they change (`Changes`): the keys of
the rows they replace and the rows in their place, both small, are kept; a query reads
the kept frame less those keys (a broadcast join) plus those rows. Caching the whole
frame again at every export cost the first run after it 1 to 3.5 s per frame of a
million rows; keeping its changes costs that run the new rows only. Once the changes
reach MERGE_SHARE of the frame's rows, they are merged into it (the frame is cached
again whole), so that no query carries a large join.

Kept frames are kept MEMORY_AND_DISK, so that a dataset larger than the driver's memory
spills rather than fails. One dataset folder is kept at a time.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from reports.dataset import TABLES, batches

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


# Changes are merged into their frame when their rows and keys reach this share of its
# rows: a query's join with them stays small, and a merge (the whole frame cached
# again) comes once every twenty exports or so of a busy incident, not at each one.
MERGE_SHARE = 0.05


@dataclass(frozen=True)
class Changes:
    """Exports' changes to a kept frame, kept apart from it: the keys (column `key`)
    of the rows they replace or remove, and the rows in their place; both cached, and
    `size` rows in all."""

    key: str
    keys: DataFrame
    rows: DataFrame
    size: int


@dataclass(frozen=True)
class Kept:
    """One table (or derived frame) as kept: the files it was read from, and its frame
    as queries read it: `base` (in memory, `base_rows` rows) as `changes` change it."""

    version: tuple
    frame: DataFrame
    base: DataFrame
    base_rows: int
    changes: Changes | None = None

    def let_go(self, *, base: bool = True) -> None:
        """Free its memory (its base's too, unless `base` is False)."""
        if base:
            self.base.unpersist()
        if self.changes is not None:
            self.changes.keys.unpersist()
            self.changes.rows.unpersist()


_kept: dict[str, Kept] = {}
_collected: dict[str, tuple[tuple, list]] = {}  # kept_rows: name -> (version, rows)
_root: Path | None = None
_lock = threading.RLock()  # reentrant: a derived frame is built from kept tables


def kept_table(data, name: str) -> DataFrame:
    """The table `name` of `data` (a reports.spark.Dataset), kept in memory and brought
    up to date with its folder (see the module's docstring)."""
    with _lock:
        _forget_other_roots(data.root)
        folder = data.root / name
        version = folder_version(folder)
        kept = _kept.get(name)
        if kept is not None and kept.version == version:
            return kept.frame
        if _only_added(name, kept, version):
            newer, arriving = _newer_rows(data, name, kept, version)
            return _keep_changed(name, version, kept, (newer.select("id"), newer, "id"), arriving)
        return _keep(name, version, data.read(name))


def kept_derived(data, name: str, sources: tuple[str, ...], build: Callable) -> DataFrame:
    """The frame `build()` computes from the tables `sources` of `data`, kept in memory
    (under `name`, a name no table has) until one of those tables changes."""
    with _lock:
        _forget_other_roots(data.root)
        version = tuple(folder_version(data.root / source) for source in sources)
        kept = _kept.get(name)
        if kept is not None and kept.version == version:
            return kept.frame
        return _keep(name, version, build())


def kept_derived_rows(
    data, name: str, table: str, looked_up: tuple[str, ...], build: Callable
) -> DataFrame:
    """The frame `build(rows)` computes row by row from rows of the table `table` (a
    row of it gives at most one row, with its `id`), looking up the tables
    `looked_up`: kept in memory (under `name`) as kept_table keeps a table. When
    exports only added batches to `table` and the looked-up tables are unchanged, only
    the new batches' rows are built, and the kept rows they hold newer versions of are
    left out; anything else builds it from the whole table again."""

    def added(newer: DataFrame) -> tuple[DataFrame, DataFrame, str]:
        return newer.select("id"), build(newer), "id"

    return _kept_from_batches(
        data, name, table, looked_up, added, lambda: build(_whole_table(data, table))
    )


def kept_derived_by_key(
    data, name: str, table: str, key: str, looked_up: tuple[str, ...], build: Callable
) -> DataFrame:
    """The frame `build(keys)` computes from the table `table` per value of its
    column `key` (each row it gives carries its key: an event's tallies from its
    deliveries), for the keys in the frame `keys`, or for every key when `keys` is
    None; it may look up the tables `looked_up`. Kept in memory (under `name`) as
    kept_derived_rows keeps a frame, except that after exports that only added batches
    to `table`, the keys those batches hold are built again, from all their rows, in
    place of their kept rows."""

    def added(newer: DataFrame) -> tuple[DataFrame, DataFrame, str]:
        keys = newer.select(key).distinct()  # an event's many new deliveries: one key
        return keys, build(keys), key

    return _kept_from_batches(data, name, table, looked_up, added, lambda: build(None))


def _kept_from_batches(
    data, name: str, table: str, looked_up: tuple[str, ...], added: Callable, whole: Callable
) -> DataFrame:
    """The frame kept as `name`, derived from the table `table` and the tables
    `looked_up`: as kept when none changed; changed by `added(new rows)` (the keys
    they replace, the rows in their place, the key's column) when exports only added
    batches to `table`; else `whole()`."""
    with _lock:
        _forget_other_roots(data.root)
        own = folder_version(data.root / table)
        others = tuple(folder_version(data.root / source) for source in looked_up)
        kept = _kept.get(name)
        if kept is not None and kept.version == (own, others):
            return kept.frame
        as_table = kept and replace(kept, version=kept.version[0])  # the table's batches
        if as_table and kept.version[1] == others and _only_added(table, as_table, own):
            newer, arriving = _newer_rows(data, table, as_table, own)
            return _keep_changed(name, (own, others), kept, added(newer), arriving)
        return _keep(name, (own, others), whole())


def _whole_table(data, name: str) -> DataFrame:
    """The table `name` for a frame derived from it row by row, built whole: as kept,
    if it is; else, when its folder holds one batch (as after a start or a compaction),
    read from its files, not kept: the frames derived from it are kept, and a table
    read by no query need not be too (keeping 10,000,000 deliveries cost 12 to 19 s
    of a start, reading them 2 to 3 s); else kept, so that its rows' versions are
    sorted out once for every frame built from it."""
    with _lock:
        folder = data.root / name
        if name in _kept or len(batches(folder)) > 1:
            return kept_table(data, name)
        return data.read(name)


def kept_rows(data, name: str) -> list:
    """The rows of the small table `name` of `data` (a snapshot table: the dispatchers),
    collected once per version of its folder: a collect, however small, is a Spark job."""
    with _lock:
        frame = kept_table(data, name)
        version = _kept[name].version
        collected = _collected.get(name)
        if collected is None or collected[0] != version:
            collected = _collected[name] = (version, frame.collect())
        return collected[1]


def _keep(name: str, version: tuple, fresh: DataFrame) -> DataFrame:
    """`fresh` computed now and kept as `name` at `version`, in place of what was."""
    frame, count = _kept_in_memory(fresh)
    replaced = _kept.get(name)
    if replaced is not None:
        replaced.let_go()
    _kept[name] = Kept(version, frame, frame, count)
    return frame


def _keep_changed(
    name: str, version: tuple, kept: Kept, change: tuple[DataFrame, DataFrame, str], arriving: int
) -> DataFrame:
    """`kept` as `name` at `version`, changed by `arriving` new rows: `change` holds the
    keys (in its column `key`) of the rows they replace, and the rows in their place.
    Their changes are kept apart (see Changes) until they reach MERGE_SHARE of its
    rows; then merged into it. Changes that will reach it at once (a frame of a few
    rows: the keys and rows are at most twice the rows arriving) are merged without
    being kept first."""
    keys, rows, key = change
    so_far = kept.changes.size if kept.changes else 0
    if so_far + 2 * arriving >= kept.base_rows * MERGE_SHARE:
        return _keep(name, version, _replaced(kept.frame, keys, rows, key))
    changes = _changes_with(kept.changes, keys, rows, key)
    frame = _changed(kept.base, changes)
    if changes.size >= kept.base_rows * MERGE_SHARE:
        merged = _keep(name, version, frame)  # lets `kept` go, once `frame` is cached
        changes.keys.unpersist()
        changes.rows.unpersist()
        return merged
    kept.let_go(base=False)
    _kept[name] = Kept(version, frame, kept.base, kept.base_rows, changes)
    return frame


def _changes_with(changes: Changes | None, keys: DataFrame, rows: DataFrame, key: str) -> Changes:
    """Changes so far, and new rows: the keys of both (each once), and their rows (the
    new ones in place of those they replace); computed now and kept."""
    keys = keys.select(key)
    if changes is not None:
        rows = _replaced(changes.rows, keys, rows, key)
        keys = changes.keys.unionByName(keys).distinct()
    kept_keys, key_count = _kept_in_memory(keys)
    kept_rows, row_count = _kept_in_memory(rows)
    return Changes(key, kept_keys, kept_rows, key_count + row_count)


def _changed(base: DataFrame, changes: Changes) -> DataFrame:
    """`base` less the rows whose key `changes` holds, and the rows in their place;
    the keys broadcast (they are at most MERGE_SHARE of the base's rows)."""
    from pyspark.sql import functions as F

    return _replaced(base, F.broadcast(changes.keys), changes.rows, changes.key)


def _replaced(frame: DataFrame, keys: DataFrame, rows: DataFrame, key: str) -> DataFrame:
    """The rows of `frame` whose `key` `keys` (that column alone) does not hold, and
    `rows` in their place."""
    return frame.join(keys, key, "left_anti").unionByName(rows)


def forget() -> None:
    """Let every kept table go (its memory is freed)."""
    with _lock:
        _forget_other_roots(None)


def _forget_other_roots(root: Path | None) -> None:
    global _root
    if root == _root:
        return
    for kept in _kept.values():
        kept.let_go()
    _kept.clear()
    _collected.clear()
    _root = root


def folder_version(folder: Path) -> tuple:
    """What a table's folder holds, cheaply: each batch (or the snapshot) with its
    files' names, inodes, sizes and times of change; equal when nothing was written."""
    parts = batches(folder) if TABLES[folder.name].incremental else [folder]
    return tuple((part.name, _files_of(part)) for part in parts if part.is_dir())


def _files_of(folder: Path) -> tuple:
    # The inode too: a file replaced whole (a snapshot exported again) is a new one.
    stats = [(f.name, f.stat()) for f in sorted(folder.glob("*.parquet"))]
    return tuple((name, st.st_ino, st.st_size, st.st_mtime_ns) for name, st in stats)


def _only_added(name: str, kept: Kept | None, version: tuple) -> bool:
    """Whether the table's folder only gained batches since `kept` was read."""
    if kept is None or not kept.version or not TABLES[name].incremental:
        return False
    return len(version) > len(kept.version) and version[: len(kept.version)] == kept.version


def _newer_rows(data, name: str, kept: Kept, version: tuple) -> tuple[DataFrame, int]:
    """The rows of the batches `version` holds beyond those `kept` was read from, and
    how many they are (from the files' footers: no Spark job)."""
    import pyarrow.parquet as pq

    new_batches = [data.root / name / part for part, _ in version[len(kept.version) :]]
    files = [path for batch in new_batches for path in batch.glob("*.parquet")]
    arriving = sum(pq.ParquetFile(path).metadata.num_rows for path in files)
    return data.read(name, only=new_batches), arriving


def _kept_in_memory(frame: DataFrame) -> tuple[DataFrame, int]:
    """`frame` computed now and kept, and its count of rows. (Its partitions are the
    files' splits, a few per core: reports.spark sets the split size, so no shuffle
    spreads them.)"""
    from pyspark import StorageLevel

    kept = frame.persist(StorageLevel.MEMORY_AND_DISK)
    count = kept.count()  # read now: the run that brings it up to date pays, not each query
    return kept, count
