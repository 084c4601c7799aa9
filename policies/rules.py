"""Policies and selectors: an expression, as the receiver's policy (over sender and
event) or the sender's selector (over receivers), with its filters (disjunctive normal
form, policies.filters) computed once."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from policies.expressions import EVENT, RECEIVER, SENDER, Expression
from policies.filters import Filter, filters_expression, to_filters


class _Rule:
    """Shared behaviour of Policy and Selector: an expression plus cached DNF."""

    expression: Expression

    def filters(self) -> list[Any]:
        """The expression as a minimal list of filters (disjunctive normal form)."""
        cached = self.__dict__.get("_filters")
        if cached is None:
            cached = to_filters(self.expression)
            object.__setattr__(self, "_filters", cached)
        return list(cached)

    def __hash__(self) -> int:
        cached = self.__dict__.get("_hash")
        if cached is None:
            cached = hash((type(self).__name__, self.expression))
            object.__setattr__(self, "_hash", cached)
        return cached


@dataclass(frozen=True, eq=True)
class Policy(_Rule):
    """A receiver's connectivity policy: ``accept <expression>`` over sender/event."""

    expression: Expression

    __hash__ = _Rule.__hash__

    def accepts(self, sender: Mapping[str, Any] | None, event: Mapping[str, Any] | None) -> bool:
        """Does this policy let ``event`` from ``sender`` through?"""
        return self.expression.evaluate({SENDER: sender, EVENT: event})

    def text(self) -> str:
        """Canonical text of the policy, ``accept ...``."""
        return f"accept {self.expression.text()}"

    def __str__(self) -> str:
        return self.text()


@dataclass(frozen=True, eq=True)
class Selector(_Rule):
    """A sender's intentional address: an expression over receiver attributes."""

    expression: Expression

    __hash__ = _Rule.__hash__

    def selects(self, receiver: Mapping[str, Any] | None) -> bool:
        """Is this receiver addressed by the selector?"""
        return self.expression.evaluate({RECEIVER: receiver})

    def text(self) -> str:
        """Canonical text of the selector."""
        return self.expression.text()

    def __str__(self) -> str:
        return self.text()


def policy_from_filters(filters: Iterable[Filter]) -> Policy:
    """The policy accepting exactly what one of the filters accepts."""
    return Policy(filters_expression(filters))


def selector_from_filters(filters: Iterable[Filter]) -> Selector:
    """The selector selecting exactly what one of the filters selects."""
    return Selector(filters_expression(filters))


def canonical_key(rule: Policy | Selector) -> frozenset[Filter]:
    """Key equal for rules with the same minimal DNF (used to share work)."""
    return frozenset(rule.filters())
