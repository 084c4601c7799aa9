"""Receiver attributes stored by column and indexed for selector constraints.

Each attribute has a column (slot -> value, None = missing) and, once a
selector asks about it, a *snapshot*: the slots sorted by value per kind
(number, text, bool) and cut into runs of equal values. A constraint becomes
a range of runs found by bisection, and the range becomes a bitset of slots:

* few distinct values (software, region, cgi): one bitset per value;
* many (load, hostname): prefix bitsets at checkpoints, so any range is two
  checkpoints combined plus at most half a checkpoint step of single slots.

Attributes change all the time (load every few seconds), so the snapshot is
not rebuilt on each change: changed slots are kept *dirty*, removed from the
snapshot's answer and re-tested one by one, until there are enough of them
to make a rebuild worthwhile.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable
from itertools import chain, pairwise
from typing import Any

from policies.bitsets import from_slots, without
from policies.expressions import Constraint
from policies.types import (
    BOOL,
    NUMBER,
    TEXT,
    VERSION,
    comparable,
    glob_literal_prefix,
    literal_domain,
    version_key,
)

LOW_CARDINALITY = 64  # at most this many distinct values: one bitset per value
_CHECKPOINTS = 128  # prefix bitsets per high-cardinality run table
MIN_CHECKPOINT_STEP = 256  # below this, building from single slots is as fast
DIRTY_MINIMUM = 1024  # changed slots tolerated before a snapshot is rebuilt
_PATTERN_CACHE = 64


class SortedRuns:
    """Slots of one kind sorted by value, as runs of equal values."""

    def __init__(self, keys: list[Any], starts: array, slots: array) -> None:
        self.keys = keys
        self.starts = starts
        self.slots = slots
        self._prepare_bitsets()
        self.all = self.runs(0, len(self.keys))

    @classmethod
    def sorted_by(cls, slots: list[int], key_of: Callable[[int], Any]) -> SortedRuns:
        """Sort ``slots`` by ``key_of(slot)`` and cut them into runs of equal keys."""
        slots.sort(key=key_of)
        keys: list[Any] = []
        starts = array("l")
        previous: Any = _START
        for position, slot in enumerate(slots):
            key = key_of(slot)
            if key != previous:
                keys.append(key)
                starts.append(position)
                previous = key
        starts.append(len(slots))
        return cls(keys, starts, array("i", slots))

    @classmethod
    def regrouped(cls, table: SortedRuns, key_of: Callable[[Any], Any]) -> SortedRuns:
        """Runs of ``table`` re-keyed by ``key_of(value)`` (None drops the run)."""
        rekeyed = [(key_of(key), index) for index, key in enumerate(table.keys)]
        rekeyed = sorted((key, index) for key, index in rekeyed if key is not None)
        keys: list[Any] = []
        starts = array("l")
        slots = array("i")
        for key, index in rekeyed:
            if not keys or keys[-1] != key:
                keys.append(key)
                starts.append(len(slots))
            slots.extend(table.slots[table.starts[index] : table.starts[index + 1]])
        starts.append(len(slots))
        return cls(keys, starts, slots)

    def _prepare_bitsets(self) -> None:
        starts, slots = self.starts, self.slots
        if len(self.keys) <= LOW_CARDINALITY:
            self.run_bits = [from_slots(slots[a:b]) for a, b in pairwise(starts)]
            return
        self.run_bits = []
        self.step = max(MIN_CHECKPOINT_STEP, -(-len(slots) // _CHECKPOINTS))
        self.checkpoints = [0]
        for edge in range(self.step, len(slots) + self.step, self.step):
            chunk = slots[edge - self.step : min(edge, len(slots))]
            self.checkpoints.append(self.checkpoints[-1] | from_slots(chunk))

    def runs(self, first: int, end: int) -> int:
        """Slots of runs ``first`` (included) to ``end`` (excluded)."""
        if first >= end:
            return 0
        if self.run_bits:
            union = 0
            for bits in self.run_bits[first:end]:
                union |= bits
            return union
        return self._positions(self.starts[first], self.starts[end])

    def _positions(self, begin: int, end: int) -> int:
        if end - begin <= 2 * self.step:
            return from_slots(self.slots[begin:end])
        return self._prefix(end) ^ self._prefix(begin)

    def _prefix(self, count: int) -> int:
        """Slots at sorted positions below ``count`` (nearest checkpoint +- a few)."""
        index = min(round(count / self.step), len(self.checkpoints) - 1)
        edge = min(index * self.step, len(self.slots))
        if count >= edge:
            return self.checkpoints[index] | from_slots(self.slots[edge:count])
        return self.checkpoints[index] ^ from_slots(self.slots[count:edge])

    def equal(self, key: Any) -> int:
        """Slots whose value equals ``key``."""
        index = bisect_left(self.keys, key)
        if index < len(self.keys) and self.keys[index] == key:
            return self.runs(index, index + 1)
        return 0

    def compare(self, op: str, key: Any) -> int:
        """Slots whose value ``op`` key holds, for ==, !=, <, <=, >, >=."""
        if op == "==":
            return self.equal(key)
        if op == "!=":
            return self.all ^ self.equal(key)
        if op in ("<", "<="):
            cut = bisect_right if op == "<=" else bisect_left
            return self.runs(0, cut(self.keys, key))
        cut = bisect_left if op == ">=" else bisect_right
        return self.runs(cut(self.keys, key), len(self.keys))

    def prefixed(self, prefix: str) -> tuple[int, int]:
        """Run range of text values starting with ``prefix`` (they are contiguous)."""
        first = bisect_left(self.keys, prefix)
        successor = _successor(prefix)
        end = len(self.keys) if successor is None else bisect_left(self.keys, successor)
        return first, end

    def where(self, predicate: Callable[[Any], bool], first: int = 0, end: int = -1) -> int:
        """Slots of runs in ``[first, end)`` whose value satisfies ``predicate``."""
        end = len(self.keys) if end < 0 else end
        chosen = [i for i in range(first, end) if predicate(self.keys[i])]
        if self.run_bits:
            return _union(self.run_bits[i] for i in chosen)
        starts = self.starts
        runs = (self.slots[starts[i] : starts[i + 1]] for i in chosen)
        return from_slots(list(chain.from_iterable(runs)))


def _union(bitsets: Any) -> int:
    union = 0
    for bits in bitsets:
        union |= bits
    return union


def _successor(prefix: str) -> str | None:
    """Smallest string greater than every string starting with ``prefix``."""
    while prefix and ord(prefix[-1]) == 0x10FFFF:
        prefix = prefix[:-1]
    if not prefix:
        return None
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


_START = object()


def value_kind(value: Any) -> str | None:
    """Which sorted table holds ``value``; None for values tested one by one."""
    if isinstance(value, bool):
        return BOOL
    if isinstance(value, int | float):
        return NUMBER if value == value else None  # NaN cannot be sorted
    return TEXT if isinstance(value, str) else None


class Snapshot:
    """Sorted tables of one attribute column at one moment."""

    def __init__(self, column: list[Any]) -> None:
        self.column = column
        by_kind: dict[str | None, list[int]] = {NUMBER: [], TEXT: [], BOOL: []}
        present: list[int] = []
        for slot, value in enumerate(column):
            if value is not None:
                present.append(slot)
                by_kind.setdefault(value_kind(value), []).append(slot)
        self.present = from_slots(present)
        self.odd = by_kind.pop(None, [])  # NaN, lists, Version objects...
        self.tables = {
            kind: SortedRuns.sorted_by(slots, column.__getitem__) for kind, slots in by_kind.items()
        }
        self._versions: SortedRuns | None = None
        self._patterns: dict[Constraint, int] = {}

    def versions(self) -> SortedRuns:
        """Text values that parse as versions, ordered by version (built on demand)."""
        if self._versions is None:
            self._versions = SortedRuns.regrouped(self.tables[TEXT], version_key)
        return self._versions

    def query(self, constraint: Constraint) -> int:
        """Slots where a positive constraint holds (exact, including odd values)."""
        if constraint.op == "exists":
            return self.present
        bits = self._indexed(constraint)
        if self.odd:
            column = self.column
            bits |= from_slots([s for s in self.odd if constraint.holds_on(column[s])])
        return bits

    def _indexed(self, constraint: Constraint) -> int:
        if constraint.op == "in":
            return _union(self._compare("==", literal) for literal in constraint.value)
        if constraint.op in ("~", "startswith", "endswith", "contains"):
            return self._pattern(constraint)
        return self._compare(constraint.op, constraint.value)

    def _compare(self, op: str, literal: Any) -> int:
        domain = literal_domain(literal)
        table = self.versions() if domain == VERSION else self.tables[domain]
        return table.compare(op, comparable(literal))

    def _pattern(self, constraint: Constraint) -> int:
        cached = self._patterns.get(constraint)
        if cached is None:
            cached = self._pattern_uncached(constraint)
            if len(self._patterns) >= _PATTERN_CACHE:
                self._patterns.clear()
            self._patterns[constraint] = cached
        return cached

    def _pattern_uncached(self, constraint: Constraint) -> int:
        table = self.tables[TEXT]
        test = constraint.holds_on
        if constraint.op == "startswith":
            return table.runs(*table.prefixed(constraint.value))
        if constraint.op == "~":
            first, end = table.prefixed(glob_literal_prefix(constraint.value))
            return table.where(test, first, end)
        return table.where(test)


class AttributeIndex:
    """One receiver attribute: its column, and a snapshot with dirty slots on top."""

    def __init__(self) -> None:
        self.column: list[Any] = []
        self._snapshot: Snapshot | None = None
        self._dirty: set[int] = set()
        self._dirty_bits: int | None = None

    def get(self, slot: int) -> Any:
        """Value at ``slot`` (None when missing)."""
        return self.column[slot] if slot < len(self.column) else None

    def set(self, slot: int, value: Any) -> None:
        """Store ``value`` (None clears) and mark the slot changed."""
        column = self.column
        if slot >= len(column):
            if value is None:
                return
            column.extend([None] * (slot + 1 - len(column)))
        if column[slot] is value:
            return
        column[slot] = value
        if self._snapshot is not None:
            self._dirty.add(slot)
            self._dirty_bits = None

    def positive(self, constraint: Constraint) -> int:
        """Slots where a positive (non-negated, not ``not exists``) constraint holds."""
        snapshot = self._current_snapshot()
        bits = snapshot.query(constraint)
        if not self._dirty:
            return bits
        if self._dirty_bits is None:
            self._dirty_bits = from_slots(self._dirty)
        get = self.get
        now_true = [slot for slot in self._dirty if constraint.holds_on(get(slot))]
        return without(bits, self._dirty_bits) | from_slots(now_true)

    def _current_snapshot(self) -> Snapshot:
        if self._snapshot is None or len(self._dirty) > max(DIRTY_MINIMUM, len(self.column) // 64):
            self._snapshot = Snapshot(self.column)
            self._dirty = set()
            self._dirty_bits = None
        return self._snapshot
