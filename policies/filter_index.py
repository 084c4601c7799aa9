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

An input's matching filters are "all minus the union of failures over the
indexed attributes": a handful of big-int operations per attribute instead
of a loop over filters. This is the elimination twin of the classic
counting algorithm; it also handles ranges with one bisection.

Two refinements keep the per-event work proportional to the attributes the
input *carries*, not to the attributes the filters mention:

* an attribute's failures are a step function of its value: constant between
  two consecutive literals of the attribute, and on each literal. When it fits
  ``REGION_BUDGET`` bytes the index stores the failure set of every step
  (``_Regions``), so a value costs one dict probe or one bisection;
* an absent attribute only fails the filters that require it. The unions of
  those sets over every run of consecutive attributes are answered by a sparse
  table (OR is idempotent, so two overlapping power-of-two runs cover any run),
  so the absent attributes between two carried ones cost two operations.
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
REGION_BUDGET = 8 << 20  # bytes of step tables per attribute and value type
_TYPE_DOMAINS = {int: NUMBER, float: NUMBER, str: TEXT, bool: BOOL}


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
class _Regions:
    """The failures of one attribute for every value of one Python type, by step.

    ``breakpoints`` are the attribute's literals in the type's domain, sorted;
    ``on_point`` maps each of them to the failures of that exact value and
    ``between[i]`` holds the failures of any value strictly between
    ``breakpoints[i - 1]`` and ``breakpoints[i]``. Residual constraints are
    not included: they are tested on the value itself.
    """

    breakpoints: list[Any]
    on_point: dict[Any, int]
    between: list[int]


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
    regions: dict[type, _Regions] = field(default_factory=dict)
    number: int = 0

    def failures(self, value: Any) -> int:
        """Filters that fail because of this attribute's ``value`` (None = missing)."""
        regions = self.regions.get(type(value))
        if regions is None or value != value:  # no step table, or NaN
            return self.computed_failures(value)
        failed = regions.on_point.get(value)
        if failed is None:
            failed = regions.between[bisect_left(regions.breakpoints, value)]
        for constraint, bits in self.residual:
            if not constraint.holds_on(value):
                failed |= bits
        return failed

    def computed_failures(self, value: Any) -> int:
        """``failures`` worked out from the thresholds, without step tables."""
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

    def build_regions(self, bitset_bytes: int) -> None:
        """Precompute step tables for the value types whose tables fit the budget."""
        for kind, domain in _TYPE_DOMAINS.items():
            if kind is str and self._mentions_versions():
                continue  # a string may also be a version: two domains at once
            breakpoints = self._breakpoints(domain)
            if any(point != point for point in breakpoints):
                continue  # NaN cannot be ordered
            if (2 * len(breakpoints) + 1) * bitset_bytes <= REGION_BUDGET:
                self.regions[kind] = self._regions(domain, breakpoints)

    def _mentions_versions(self) -> bool:
        return self.has_versions or VERSION in self.lower or VERSION in self.upper

    def _breakpoints(self, domain: str) -> list[Any]:
        points = {value for (key_domain, value) in self.equal if key_domain == domain}
        for tables in (self.lower, self.upper):
            if domain in tables:
                points.update(threshold for threshold, _ in tables[domain].entries)
        if domain == BOOL:
            points.update((False, True))
        return sorted(points)

    def _regions(self, domain: str, breakpoints: list[Any]) -> _Regions:
        # Thresholds of another domain never hold on a value of this one.
        always = self.forbids_presence
        for tables in (self.lower, self.upper):
            for other, table in tables.items():
                if other != domain:
                    always |= table.members
        on_point = {
            value: always | self._step_failures(domain, (value, 1), (domain, value))
            for value in breakpoints
        }
        # A value between two breakpoints passes every threshold below the upper one.
        between = [
            always | self._step_failures(domain, (value, -1), None)
            for value in [*breakpoints, None]
        ]
        return _Regions(breakpoints, on_point, between)

    def _step_failures(self, domain: str, key: tuple[Any, int], equal_key: Any) -> int:
        """Failures of a value ordered just before ``key`` (equal to it if ``equal_key``)."""
        accepting = self.equal.get(equal_key, 0) if equal_key is not None else 0
        failed = self.equal_members ^ accepting
        lower, upper = self.lower.get(domain), self.upper.get(domain)
        if lower is not None:
            failed |= lower.members ^ lower.prefix(_count_before(lower, key))
        if upper is not None:
            failed |= upper.prefix(_count_before(upper, key))
        return failed


def _count_before(table: _Thresholds, key: tuple[Any, int]) -> int:
    """Entries ordered before ``key``; all of them for a ``None`` value (beyond the last)."""
    if key[0] is None:
        return len(table.entries)
    return bisect_left(table.entries, key)


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
        self._by_scope: dict[str, dict[str, _AttributeIndex]] = {}
        for number, ((scope, name), index) in enumerate(self.attributes):
            index.number = number
            index.build_regions((self.size + 7) // 8)
            self._by_scope.setdefault(scope, {})[name] = index
        self._scopes = list(self._by_scope.items())
        self._required = _RunUnions([index.requires_presence for _, index in self.attributes])

    def match(self, scopes: Scopes) -> int:
        """Bitset of positions of the filters that hold on ``scopes``."""
        failed = 0
        present: list[int] = []
        for scope, indexes in self._scopes:
            attributes = scopes.get(scope)
            if not attributes:
                continue
            for name, value in attributes.items():
                index = indexes.get(name)
                if index is None or value is None:
                    continue
                present.append(index.number)
                # The common case inline (a call costs as much as the lookup):
                regions = index.regions.get(type(value))
                if regions is None or index.residual or value != value:
                    failed |= index.failures(value)
                    continue
                step = regions.on_point.get(value)
                if step is None:
                    step = regions.between[bisect_left(regions.breakpoints, value)]
                failed |= step
        failed |= self._required.outside(present)
        return self.all ^ (self.all & failed)


class _RunUnions:
    """Unions of bitsets over runs ``[start, stop)`` of a list, two operations each.

    A sparse table: ``levels[j][i]`` is the union of the ``2**j`` bitsets from
    ``i``; since OR is idempotent, the two overlapping power-of-two runs that
    start and end the run cover it exactly.
    """

    def __init__(self, bitsets: list[int]) -> None:
        self.size = len(bitsets)
        self.levels = [bitsets]
        width = 1
        while 2 * width <= self.size:
            previous = self.levels[-1]
            upper = self.size - 2 * width + 1
            self.levels.append([previous[i] | previous[i + width] for i in range(upper)])
            width *= 2

    def outside(self, excluded: list[int]) -> int:
        """Union of every bitset whose position is not in ``excluded`` (distinct positions)."""
        union, start, levels = 0, 0, self.levels
        for stop in [*sorted(excluded), self.size]:
            if stop > start:  # the run [start, stop)
                level = (stop - start).bit_length() - 1
                row = levels[level]
                union |= row[start] | row[stop - (1 << level)]
            start = stop + 1
        return union


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
