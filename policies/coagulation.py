"""Coagulation: generalise many filters into at most N that still cover them all.

A dispatcher summarising a subtree only needs an over-approximation: a few
broad filters that accept at least what the many precise ones accept. The
greedy loop merges the two most similar filters until the budget is met.

A merge proposes candidate constraints per attribute (the constraints both
share, ``exists``, the union of ``==``/``in`` values, the hull of two
intervals, a common prefix or suffix) and keeps only those that
``covering.implied`` proves for *both* inputs, so the merged filter covers
both by construction. Constraints nobody can prove are dropped, which only
widens the filter.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations
from typing import Any

from policies.covering import Facts, covers, facts_of, implied, text_facts
from policies.expressions import Constraint
from policies.filters import Filter
from policies.types import TEXT, Version, literal_domain

MAX_MERGED_VALUES = 32  # an `in` list longer than this is widened further
_PAIRWISE_LIMIT = 600  # above this many filters, pre-merge by attribute signature


def coagulate(filters: Iterable[Filter], max_filters: int) -> list[Filter]:
    """At most ``max_filters`` filters that together cover every input filter."""
    if max_filters < 1:
        raise ValueError("max_filters must be at least 1")
    pool = _drop_covered(list(dict.fromkeys(filters)))
    if len(pool) > _PAIRWISE_LIMIT and len(pool) > max_filters:
        pool = _drop_covered(_merge_by_signature(pool))
    if len(pool) > max_filters:
        pool = _greedy_merge(pool, max_filters)
    return sorted(pool, key=Filter.text)


def _drop_covered(filters: list[Filter]) -> list[Filter]:
    """Remove filters covered by another one (keeping one of equivalent ones)."""
    ordered = sorted(filters, key=len)  # broader (shorter) filters first
    kept: list[Filter] = []
    for candidate in ordered:
        if not any(covers(existing, candidate) for existing in kept):
            kept.append(candidate)
    return kept


def _merge_by_signature(filters: list[Filter]) -> list[Filter]:
    """Merge filters constraining the same attributes first: cheap and similar."""
    groups: dict[frozenset[tuple[str, str]], list[Filter]] = {}
    for f in filters:
        groups.setdefault(frozenset(c.attribute for c in f.constraints), []).append(f)
    merged: list[Filter] = []
    for group in groups.values():
        combined = group[0]
        for other in group[1:]:
            combined = merge(combined, other)
        merged.append(combined)
    return merged


def _greedy_merge(filters: list[Filter], max_filters: int) -> list[Filter]:
    live: dict[int, Filter] = dict(enumerate(filters))
    heap = [(_distance(a, b), i, j) for (i, a), (j, b) in combinations(live.items(), 2)]
    heapq.heapify(heap)
    next_id = len(filters)
    while len(live) > max_filters and heap:
        _, i, j = heapq.heappop(heap)
        if i not in live or j not in live:
            continue  # stale pair: one side was merged already
        merged = merge(live.pop(i), live.pop(j))
        for k in [k for k, f in live.items() if covers(merged, f)]:
            del live[k]
        for k, other in live.items():
            heapq.heappush(heap, (_distance(merged, other), k, next_id))
        live[next_id] = merged
        next_id += 1
    return list(live.values())


def _distance(a: Filter, b: Filter) -> tuple[int, int]:
    """How much is lost merging a and b: differing constraints, then attributes."""
    attributes_a = {c.attribute for c in a.constraints}
    attributes_b = {c.attribute for c in b.constraints}
    return (len(a.constraints ^ b.constraints), len(attributes_a ^ attributes_b))


def merge(a: Filter, b: Filter) -> Filter:
    """The most specific filter this module can prove covers both ``a`` and ``b``."""
    facts_a = _by_attribute(a)
    facts_b = _by_attribute(b)
    kept: set[Constraint] = set(a.constraints & b.constraints)
    for attribute in facts_a.keys() & facts_b.keys():
        left, right = facts_a[attribute], facts_b[attribute]
        for candidate in _candidates(attribute, left, right):
            if _proved(candidate, left) and _proved(candidate, right):
                kept.add(candidate)
    return Filter(frozenset(_without_redundant(kept)))


def _without_redundant(constraints: set[Constraint]) -> set[Constraint]:
    """Drop constraints implied by the others on their attribute (weakest first)."""
    remaining = set(constraints)
    for constraint in sorted(constraints, key=_weakness):
        siblings = [c for c in remaining if c.attribute == constraint.attribute and c != constraint]
        if siblings and implied(constraint, facts_of(siblings)):
            remaining.discard(constraint)
    return remaining


def _weakness(constraint: Constraint) -> tuple[int, str]:
    order = {"exists": 0, "<": 1, "<=": 1, ">": 1, ">=": 1, "startswith": 2, "endswith": 2}
    return (order.get(constraint.op, 3), constraint.text())


def _proved(candidate: Constraint, facts: Facts) -> bool:
    return facts.unsatisfiable() or implied(candidate, facts)


def _by_attribute(f: Filter) -> dict[tuple[str, str], Facts]:
    grouped: dict[tuple[str, str], list[Constraint]] = {}
    for constraint in f.constraints:
        grouped.setdefault(constraint.attribute, []).append(constraint)
    return {attribute: facts_of(group) for attribute, group in grouped.items()}


def _candidates(attribute: tuple[str, str], left: Facts, right: Facts) -> list[Constraint]:
    scope, name = attribute
    proposals: list[Constraint] = [Constraint(scope, name, "exists")]
    proposals += _value_union(scope, name, left, right)
    proposals += _interval_hull(scope, name, left, right)
    proposals += _common_text(scope, name, left, right)
    return proposals


def _value_union(scope: str, name: str, left: Facts, right: Facts) -> list[Constraint]:
    if left.candidates is None or right.candidates is None:
        return []
    values = list(dict.fromkeys(_typed_values(left.candidates + right.candidates)))
    if not values or len(values) > MAX_MERGED_VALUES:
        return []
    literals = tuple(value for _, value in values)
    if len(literals) == 1:
        return [Constraint(scope, name, "==", literals[0])]
    return [Constraint(scope, name, "in", literals)]


def _typed_values(values: list[Any]) -> list[tuple[str, Any]]:
    # Keep 1 and true apart while de-duplicating.
    return [(type(value).__name__, value) for value in values]


def _interval_hull(scope: str, name: str, left: Facts, right: Facts) -> list[Constraint]:
    proposals: list[Constraint] = []
    for domain in left.intervals.keys() & right.intervals.keys():
        bounds_left = _bound_literals(left, domain)
        bounds_right = _bound_literals(right, domain)
        lows = [bounds_left[0], bounds_right[0]]
        highs = [bounds_left[1], bounds_right[1]]
        if None not in lows:
            proposals.append(Constraint(scope, name, ">=", min(lows, key=_order_key)))
        if None not in highs:
            proposals.append(Constraint(scope, name, "<=", max(highs, key=_order_key)))
    return proposals


def _bound_literals(facts: Facts, domain: str) -> tuple[Any, Any]:
    """Loosest literal lower and upper bounds stated in ``domain`` (None = open)."""
    lows, highs = [], []
    for constraint in facts.positives:
        if constraint.op == "in" or literal_domain(constraint.value) != domain:
            continue
        if constraint.op in (">", ">=", "=="):
            lows.append(constraint.value)
        if constraint.op in ("<", "<=", "=="):
            highs.append(constraint.value)
    low = max(lows, key=_order_key) if lows else None
    high = min(highs, key=_order_key) if highs else None
    return low, high


def _order_key(literal: Any) -> Any:
    return literal.key if isinstance(literal, Version) else literal


def _common_text(scope: str, name: str, left: Facts, right: Facts) -> list[Constraint]:
    prefix = _common(_texts(left, "prefix"), _texts(right, "prefix"), _common_prefix)
    suffix = _common(_texts(left, "suffix"), _texts(right, "suffix"), _common_suffix)
    proposals = []
    if prefix:
        proposals.append(Constraint(scope, name, "startswith", prefix))
    if suffix:
        proposals.append(Constraint(scope, name, "endswith", suffix))
    return proposals


def _texts(facts: Facts, kind: str) -> list[str]:
    found = [text for fact, text in facts.texts if fact == kind]
    if facts.candidates:
        found += [v for v in facts.candidates if literal_domain(v) == TEXT]
    return found


def _common(left: list[str], right: list[str], combine: Any) -> str:
    if not left or not right:
        return ""
    # The longest known text on each side is the most informative one.
    return combine([max(left, key=len), max(right, key=len)])


def _common_prefix(texts: list[str]) -> str:
    first, last = min(texts), max(texts)  # the extremes share the common prefix
    length = 0
    while length < min(len(first), len(last)) and first[length] == last[length]:
        length += 1
    return first[:length]


def _common_suffix(texts: list[str]) -> str:
    return _common_prefix([text[::-1] for text in texts])[::-1]


# ---------------------------------------------------------------------------
# Reporting


@dataclass(frozen=True)
class OverAcceptance:
    """How much a coagulated summary accepts beyond the original filters on a sample."""

    samples: int
    accepted_by_original: int
    accepted_by_coagulated: int
    false_negatives: int  # must be 0: coagulation never under-approximates

    @property
    def extra(self) -> int:
        """Inputs accepted only by the coagulated filters."""
        return self.accepted_by_coagulated - self.accepted_by_original + self.false_negatives

    @property
    def rate(self) -> float:
        """Share of sample inputs wrongly accepted by the summary."""
        return self.extra / self.samples if self.samples else 0.0

    def __str__(self) -> str:
        return (
            f"{self.samples} samples: original accepts {self.accepted_by_original}, "
            f"coagulated accepts {self.accepted_by_coagulated} "
            f"(over-acceptance {self.rate:.1%}, missed {self.false_negatives})"
        )


def over_acceptance(
    original: Sequence[Filter],
    coagulated: Sequence[Filter],
    sample: Iterable[Mapping[str, Mapping[str, Any] | None]],
) -> OverAcceptance:
    """Compare acceptance on sample inputs (each a scopes mapping, e.g. ``{"event": {...}}``)."""
    samples = by_original = by_coagulated = missed = 0
    for scopes in sample:
        in_original = any(f.matches(scopes) for f in original)
        in_coagulated = any(f.matches(scopes) for f in coagulated)
        samples += 1
        by_original += in_original
        by_coagulated += in_coagulated
        missed += in_original and not in_coagulated
    return OverAcceptance(samples, by_original, by_coagulated, missed)


__all__ = ["OverAcceptance", "coagulate", "merge", "over_acceptance", "text_facts"]
