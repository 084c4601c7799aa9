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

Kept frames are kept MEMORY_AND_DISK, so that a dataset larger than the driver's memory
spills rather than fails. One dataset folder is kept at a time.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from reports.dataset import TABLES, batches

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


@dataclass(frozen=True)
class Kept:
    """One table as kept: the files it was read from, and its frame in memory."""

    version: tuple
    frame: DataFrame


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
            return _keep(name, version, _updated(data, name, kept, version))
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

    def added(kept: DataFrame, newer: DataFrame) -> DataFrame:
        return _replaced(kept, newer, build(newer))

    return _kept_from_batches(data, name, table, looked_up, added, lambda: build(data.table(table)))


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

    def added(kept: DataFrame, newer: DataFrame) -> DataFrame:
        keys = newer.select(key).distinct()  # an event's many new deliveries: one key
        return _replaced(kept, keys, build(keys), key=key)

    return _kept_from_batches(data, name, table, looked_up, added, lambda: build(None))


def _kept_from_batches(
    data, name: str, table: str, looked_up: tuple[str, ...], added: Callable, whole: Callable
) -> DataFrame:
    """The frame kept as `name`, derived from the table `table` and the tables
    `looked_up`: as kept when none changed; `added(kept frame, new rows)` when exports
    only added batches to `table`; else `whole()`."""
    with _lock:
        _forget_other_roots(data.root)
        own = folder_version(data.root / table)
        others = tuple(folder_version(data.root / source) for source in looked_up)
        kept = _kept.get(name)
        if kept is not None and kept.version == (own, others):
            return kept.frame
        as_table = Kept(kept.version[0], kept.frame) if kept is not None else None
        if as_table and kept.version[1] == others and _only_added(table, as_table, own):
            newer = _newer_rows(data, table, as_table, own)
            return _keep(name, (own, others), added(kept.frame, newer))
        return _keep(name, (own, others), whole())


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
    frame = _kept_in_memory(fresh)
    replaced = _kept.get(name)
    if replaced is not None:
        replaced.frame.unpersist()
    _kept[name] = Kept(version, frame)
    return frame


def forget() -> None:
    """Let every kept table go (its memory is freed)."""
    with _lock:
        _forget_other_roots(None)


def _forget_other_roots(root: Path | None) -> None:
    global _root
    if root == _root:
        return
    for kept in _kept.values():
        kept.frame.unpersist()
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


def _updated(data, name: str, kept: Kept, version: tuple) -> DataFrame:
    """The kept rows, less those the new batches hold newer versions of, and theirs."""
    newer = _newer_rows(data, name, kept, version)
    return _replaced(kept.frame, newer, newer)


def _replaced(kept: DataFrame, newer: DataFrame, fresh: DataFrame, key: str = "id") -> DataFrame:
    """The `kept` rows whose `key` (their id) `newer` (new rows of a table) does not
    hold, and `fresh` (those rows, or what was built from them)."""
    return kept.join(newer.select(key), key, "left_anti").unionByName(fresh)


def _newer_rows(data, name: str, kept: Kept, version: tuple) -> DataFrame:
    """The rows of the batches `version` holds beyond those `kept` was read from."""
    new_batches = [data.root / name / part for part, _ in version[len(kept.version) :]]
    return data.read(name, only=new_batches)


def _kept_in_memory(frame: DataFrame) -> DataFrame:
    """`frame` computed now and kept. (Its partitions are the files' splits, a few per
    core: reports.spark sets the split size, so no shuffle spreads them.)"""
    from pyspark import StorageLevel

    kept = frame.persist(StorageLevel.MEMORY_AND_DISK)
    kept.count()  # read now: the run that brings it up to date pays, not each query
    return kept
