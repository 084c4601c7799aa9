"""Filters (conjunctions of constraints) and disjunctive normal form.

A policy or selector is equivalent to a list of filters: it holds iff one of
the filters holds. ``not`` is pushed down to the constraints: ``not (x exists)``
becomes ``x not exists`` and any other negated constraint keeps an explicit
``negated`` flag, because ``not (x == 1)`` is *not* ``x != 1``: the former is
true when ``x`` is missing or of another type, the latter is false. Keeping the
flag makes the conversion exact, which the property tests check.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from itertools import product
from typing import Any

from policies.expressions import (
    EVENT,
    RECEIVER,
    SENDER,
    Always,
    And,
    Constraint,
    Expression,
    Not,
    Scopes,
    conjunction,
    disjunction,
)

MAX_FILTERS = 1024


class FilterExplosion(ValueError):
    """The expression expands to more than MAX_FILTERS alternatives."""


@dataclass(frozen=True)
class Filter:
    """A conjunction of constraints; the empty filter accepts everything."""

    constraints: frozenset[Constraint] = frozenset()

    def __post_init__(self) -> None:
        if not isinstance(self.constraints, frozenset):
            object.__setattr__(self, "constraints", frozenset(self.constraints))

    @classmethod
    def of(cls, *constraints: Constraint) -> Filter:
        """Filter of the given constraints."""
        return cls(frozenset(constraints))

    def __iter__(self) -> Iterator[Constraint]:
        return iter(self.sorted_constraints())

    def __len__(self) -> int:
        return len(self.constraints)

    def matches(self, scopes: Scopes) -> bool:
        """Do all constraints hold on these scopes?"""
        return all(constraint.evaluate(scopes) for constraint in self.constraints)

    def accepts(self, sender: Mapping[str, Any] | None, event: Mapping[str, Any] | None) -> bool:
        """Policy-side evaluation: sender and event attributes."""
        return self.matches({SENDER: sender, EVENT: event})

    def selects(self, receiver: Mapping[str, Any] | None) -> bool:
        """Selector-side evaluation: receiver attributes."""
        return self.matches({RECEIVER: receiver})

    def sorted_constraints(self) -> list[Constraint]:
        """Constraints in canonical order."""
        return sorted(self.constraints, key=Constraint.sort_key)

    def is_contradictory(self) -> bool:
        """Contains a constraint and its exact complement (never holds)."""
        return any(constraint.negate() in self.constraints for constraint in self.constraints)

    def text(self) -> str:
        """Canonical text: constraints in canonical order joined by ``and``."""
        if not self.constraints:
            return "true"
        return " and ".join(constraint.text() for constraint in self.sorted_constraints())

    def expression(self) -> Expression:
        """This filter as an expression (negated constraints become ``not``)."""
        return conjunction(_as_expression(c) for c in self.sorted_constraints())

    def __str__(self) -> str:
        return self.text()


def _as_expression(constraint: Constraint) -> Expression:
    return Not(constraint.positive()) if constraint.negated else constraint


# ---------------------------------------------------------------------------
# Expression -> filters


def to_filters(expression: Expression) -> list[Filter]:
    """Minimal disjunctive normal form of an expression, in canonical order."""
    conjunctions = _dnf(expression, negate=False)
    return sorted((Filter(c) for c in _minimize(conjunctions)), key=Filter.text)


def _dnf(expression: Expression, negate: bool) -> list[frozenset[Constraint]]:
    if isinstance(expression, Constraint):
        return [frozenset({expression.negate() if negate else expression})]
    if isinstance(expression, Always):
        return [frozenset()] if expression.value != negate else []
    if isinstance(expression, Not):
        return _dnf(expression.operand, not negate)
    parts = [_dnf(operand, negate) for operand in expression.operands]  # type: ignore[attr-defined]
    # De Morgan: under negation an And distributes like an Or and vice versa.
    if isinstance(expression, And) != negate:
        return _product(parts)
    return _minimize([conj for part in parts for conj in part])


def _product(parts: list[list[frozenset[Constraint]]]) -> list[frozenset[Constraint]]:
    result: list[frozenset[Constraint]] = [frozenset()]
    for part in parts:
        if len(result) * len(part) > MAX_FILTERS * 4:
            raise FilterExplosion
        combined = (left | right for left, right in product(result, part))
        result = _minimize(c for c in combined if not Filter(c).is_contradictory())
        if len(result) > MAX_FILTERS:
            raise FilterExplosion
    return result


def _minimize(conjunctions: Iterable[frozenset[Constraint]]) -> list[frozenset[Constraint]]:
    """Drop duplicates and conjunctions that contain another one (absorption)."""
    unique = sorted(set(conjunctions), key=len)
    kept: list[frozenset[Constraint]] = []
    for candidate in unique:
        if not any(smaller <= candidate for smaller in kept):
            kept.append(candidate)
    if len(kept) > MAX_FILTERS:
        raise FilterExplosion
    return kept


# ---------------------------------------------------------------------------
# Filters -> text and back


def filters_text(filters: Iterable[Filter]) -> str:
    """Canonical expression text of a disjunction of filters."""
    ordered = sorted(set(filters), key=Filter.text)
    if not ordered:
        return "false"
    if len(ordered) == 1:
        return ordered[0].text()
    return " or ".join(f"({f.text()})" if len(f) > 1 else f.text() for f in ordered)


def filters_expression(filters: Iterable[Filter]) -> Expression:
    """A disjunction of filters as an expression."""
    return disjunction(f.expression() for f in sorted(set(filters), key=Filter.text))


def policy_text(filters: Iterable[Filter]) -> str:
    """Canonical ``accept ...`` text of a list of policy filters."""
    return f"accept {filters_text(filters)}"


__all__ = [
    "Filter",
    "FilterExplosion",
    "filters_expression",
    "filters_text",
    "policy_text",
    "to_filters",
]
