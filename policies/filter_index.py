"""Which of many filters hold on one input, without testing them one by one.

Filters are numbered; sets of filters are bitsets. For each attribute the
index precomputes which filters *fail* for any value of that attribute:

* missing value: every filter with a positive constraint on it;
* ``==`` / ``in``: a hash map from value to the filters that accept it;
* ``>``/``>=`` and ``<``/``<=``: thresholds sorted per domain with prefix
  bitsets, so the filters satisfied by a value are a prefix found by bisection;
* anything else (``!=``, patterns, negations, a second range on the same
  attribute): tested once per distinct constraint, then its filters are
  looked up as a bitset.

An input's matching filters are "all minus the union of failures over all
indexed attributes": a handful of big-int operations per attribute instead
of a loop over filters. This is the elimination twin of the classic
counting algorithm; it also handles ranges with one bisection.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from policies.bitsets import from_slots
from policies.expressions import Constraint, Scopes
from policies.filters import Filter
from policies.types import BOOL, NUMBER, TEXT, VERSION, Version, literal_domain, to_domain
from policies.types import NO_VALUE as _NO_VALUE

_LOWER = {">=": 0, ">": 1}  # flag orders ties: ">= t" is satisfied by t, "> t" is not
_UPPER = {"<": 0, "<=": 1}  # "< t" fails on t, "<= t" does not
CHECKPOINT_EVERY = 16


@dataclass
class _Thresholds:
    """Sorted ``(threshold, flag)`` entries with the filters of each, and prefix unions."""

    entries: list[tuple[Any, int]] = field(default_factory=list)
    entry_bits: list[int] = field(default_factory=list)
    checkpoints: list[int] = field(default_factory=list)
    members: int = 0

    @classmethod
    def build(cls, grouped: dict[tuple[Any, int], list[int]]) -> _Thresholds:
        """Index thresholds given ``{(threshold, flag): [filter positions]}``."""
        table = cls()
        table.entries = sorted(grouped)
        table.entry_bits = [from_slots(grouped[entry]) for entry in table.entries]
        union = 0
        for position, bits in enumerate(table.entry_bits):
            if position % CHECKPOINT_EVERY == 0:
                table.checkpoints.append(union)
            union |= bits
        table.members = union
        return table

    def prefix(self, count: int) -> int:
        """Union of the filters of the first ``count`` entries."""
        checkpoint = count // CHECKPOINT_EVERY
        if checkpoint >= len(self.checkpoints):
            checkpoint = len(self.checkpoints) - 1
        union = self.checkpoints[checkpoint] if self.checkpoints else 0
        for bits in self.entry_bits[checkpoint * CHECKPOINT_EVERY : count]:
            union |= bits
        return union

    def count_below(self, value: Any) -> int:
        """Entries ordered before ``(value, 1)``."""
        return bisect_left(self.entries, (value, 1))


@dataclass
class _AttributeIndex:
    """Everything the index knows about one ``(scope, name)``."""

    requires_presence: int = 0
    forbids_presence: int = 0
    equal_members: int = 0
    equal: dict[tuple[str, Any], int] = field(default_factory=dict)
    lower: dict[str, _Thresholds] = field(default_factory=dict)
    upper: dict[str, _Thresholds] = field(default_factory=dict)
    residual: list[tuple[Constraint, int]] = field(default_factory=list)
    has_versions: bool = False

    def failures(self, value: Any) -> int:
        """Filters that fail because of this attribute's ``value`` (None = missing)."""
        if value is None:
            return self.requires_presence
        failed = self.forbids_presence
        if self.equal_members:
            failed |= self.equal_members ^ self._equal_accepting(value)
        for domain, table in self.lower.items():
            count = _satisfied_count(table, value, domain)
            failed |= table.members ^ table.prefix(count)
        for domain, table in self.upper.items():
            failed |= _upper_failures(table, value, domain)
        for constraint, bits in self.residual:
            if not constraint.holds_on(value):
                failed |= bits
        return failed

    def _equal_accepting(self, value: Any) -> int:
        accepting = 0
        for key in _value_keys(value, self.has_versions):
            accepting |= self.equal.get(key, 0)
        return accepting


def _satisfied_count(table: _Thresholds, value: Any, domain: str) -> int:
    converted = to_domain(value, domain)
    if converted is _NO_VALUE or converted != converted:  # wrong type or NaN
        return 0
    return table.count_below(converted)


def _upper_failures(table: _Thresholds, value: Any, domain: str) -> int:
    converted = to_domain(value, domain)
    if converted is _NO_VALUE or converted != converted:
        return table.members
    return table.prefix(table.count_below(converted))


def _value_keys(value: Any, has_versions: bool) -> list[tuple[str, Any]]:
    """Hash keys under which ``==``/``in`` literals equal to ``value`` are stored."""
    if isinstance(value, bool):
        return [(BOOL, value)]
    if isinstance(value, int | float):
        return [(NUMBER, value)]
    if isinstance(value, Version):
        return [(TEXT, value.text), (VERSION, value.key)]
    if not isinstance(value, str):
        return []
    keys = [(TEXT, value)]
    if has_versions:
        converted = to_domain(value, VERSION)
        if converted is not _NO_VALUE:
            keys.append((VERSION, converted))
    return keys


class FilterIndex:
    """Static index over a sequence of filters; ``match`` returns a bitset of positions."""

    def __init__(self, filters: Sequence[Filter]) -> None:
        self.size = len(filters)
        self.all = (1 << self.size) - 1
        builder = _Builder()
        for position, f in enumerate(filters):
            builder.add(position, f)
        self.attributes = builder.finish()

    def match(self, scopes: Scopes) -> int:
        """Bitset of positions of the filters that hold on ``scopes``."""
        failed = 0
        for (scope, name), index in self.attributes:
            attributes = scopes.get(scope)
            failed |= index.failures(attributes.get(name) if attributes else None)
        return self.all ^ (self.all & failed)


class _Builder:
    """Collects filter positions per attribute and per constraint class."""

    def __init__(self) -> None:
        self.presence: dict[tuple[str, str], list[int]] = {}
        self.absence: dict[tuple[str, str], list[int]] = {}
        self.equal: dict[tuple[str, str], dict[tuple[str, Any], list[int]]] = {}
        self.equal_members: dict[tuple[str, str], list[int]] = {}
        self.lower: dict[tuple[str, str], dict[str, dict[tuple[Any, int], list[int]]]] = {}
        self.upper: dict[tuple[str, str], dict[str, dict[tuple[Any, int], list[int]]]] = {}
        self.residual: dict[tuple[str, str], dict[Constraint, list[int]]] = {}

    def add(self, position: int, f: Filter) -> None:
        """Register filter ``f`` at ``position``."""
        used: set[tuple[tuple[str, str], str]] = set()
        for constraint in f.sorted_constraints():
            self._add_constraint(position, constraint, used)

    def _add_constraint(self, position: int, constraint: Constraint, used: set) -> None:
        attribute = constraint.attribute
        if constraint.op == "not exists":
            self.absence.setdefault(attribute, []).append(position)
            return
        if not constraint.negated:
            self.presence.setdefault(attribute, []).append(position)
        if constraint.op == "exists":
            return
        slot = _class_of(constraint)
        # One constraint per class and filter can be indexed; a second one
        # (e.g. two lower bounds) is simply tested as a residual.
        if slot is None or (attribute, slot) in used:
            self.residual.setdefault(attribute, {}).setdefault(constraint, []).append(position)
            return
        used.add((attribute, slot))
        getattr(self, f"_add_{slot}")(position, constraint)

    def _add_equal(self, position: int, constraint: Constraint) -> None:
        values = constraint.value if constraint.op == "in" else (constraint.value,)
        table = self.equal.setdefault(constraint.attribute, {})
        for value in values:
            key = (literal_domain(value), value.key if isinstance(value, Version) else value)
            table.setdefault(key, []).append(position)
        self.equal_members.setdefault(constraint.attribute, []).append(position)

    def _add_lower(self, position: int, constraint: Constraint) -> None:
        self._add_threshold(self.lower, _LOWER, position, constraint)

    def _add_upper(self, position: int, constraint: Constraint) -> None:
        self._add_threshold(self.upper, _UPPER, position, constraint)

    def _add_threshold(self, tables: dict, flags: dict, position: int, c: Constraint) -> None:
        domain = literal_domain(c.value)
        threshold = c.value.key if isinstance(c.value, Version) else c.value
        by_domain = tables.setdefault(c.attribute, {}).setdefault(domain, {})
        by_domain.setdefault((threshold, flags[c.op]), []).append(position)

    def finish(self) -> list[tuple[tuple[str, str], _AttributeIndex]]:
        """Turn the collected positions into per-attribute indexes."""
        names = set(self.presence) | set(self.absence) | set(self.residual)
        return [(attribute, self._attribute_index(attribute)) for attribute in sorted(names)]

    def _attribute_index(self, attribute: tuple[str, str]) -> _AttributeIndex:
        equal = {key: from_slots(p) for key, p in self.equal.get(attribute, {}).items()}
        residual = self.residual.get(attribute, {})
        return _AttributeIndex(
            requires_presence=from_slots(self.presence.get(attribute, [])),
            forbids_presence=from_slots(self.absence.get(attribute, [])),
            equal_members=from_slots(self.equal_members.get(attribute, [])),
            equal=equal,
            lower={d: _Thresholds.build(g) for d, g in self.lower.get(attribute, {}).items()},
            upper={d: _Thresholds.build(g) for d, g in self.upper.get(attribute, {}).items()},
            residual=[(constraint, from_slots(p)) for constraint, p in residual.items()],
            has_versions=any(domain == VERSION for domain, _ in equal),
        )


def _class_of(constraint: Constraint) -> str | None:
    """Which indexed class a constraint belongs to (None: test it directly)."""
    if constraint.negated:
        return None
    if constraint.op in ("==", "in"):
        return "equal"
    if constraint.op in _LOWER and literal_domain(constraint.value) != BOOL:
        return "lower"
    if constraint.op in _UPPER and literal_domain(constraint.value) != BOOL:
        return "upper"
    return None
