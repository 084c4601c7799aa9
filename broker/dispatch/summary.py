"""Subtree summaries: what a dispatcher's receivers accept and what they look like.

A summary answers two questions cheaply and conservatively: may some receiver below
accept this sender and content (`may_accept`), and may the selector select some
receiver below (`may_select`)? "No" must be certain; "yes" may be wrong. Pure Python.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from broker.vocabulary import Vocabulary
from policies import (
    Filter,
    Policy,
    PolicySyntaxError,
    Selector,
    coagulate,
    covers_all,
    over_acceptance,
)
from policies.filters import filters_text

log = logging.getLogger(__name__)

MAX_POLICY_FILTERS = 32
MAX_DISTINCT_VALUES = 64
RANGE_OPS = frozenset({"<", "<=", ">", ">=", "=="})


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _key(value: Any) -> tuple:
    """A set key that keeps True apart from 1 and False from 0 (Python deems them
    equal; the policy language does not)."""
    return (type(value) is bool, value)


@dataclass
class AttributeSummary:
    """The values one attribute takes among a subtree's receivers."""

    present: int = 0
    # Distinct values by _key; None when there were too many to list.
    values: dict[tuple, Any] | None = field(default_factory=dict)
    low: float | None = None
    high: float | None = None

    def add(self, value: Any) -> None:
        self.present += 1
        if _is_number(value):
            self.low = value if self.low is None else min(self.low, value)
            self.high = value if self.high is None else max(self.high, value)
        if self.values is not None:
            self.values[_key(value)] = value
            if len(self.values) > MAX_DISTINCT_VALUES:
                self.values = None

    def merge(self, other: AttributeSummary) -> None:
        self.present += other.present
        for bound in (other.low, other.high):
            if bound is not None:
                self.low = bound if self.low is None else min(self.low, bound)
                self.high = bound if self.high is None else max(self.high, bound)
        if self.values is None or other.values is None:
            self.values = None
        else:
            self.values.update(other.values)
            if len(self.values) > MAX_DISTINCT_VALUES:
                self.values = None

    def lists_numbers_beyond(self, other: AttributeSummary | None) -> bool:
        """Whether this lists only numbers, some of them not listed by `other` (which
        lists nothing, or lacks the attribute): a measured value that moved."""
        if not self.values or not all(map(_is_number, self.values.values())):
            return False
        return (
            other is None or other.values is None or not self.values.keys() <= other.values.keys()
        )

    def may_hold(self, constraint) -> bool:
        """May the constraint hold on some receiver that has this attribute?"""
        if self.present == 0:
            return False
        if self.values is not None:
            return any(constraint.holds_on(value) for value in self.values.values())
        if constraint.negated or constraint.op not in RANGE_OPS or self.low is None:
            return True  # unknown text values: cannot rule anything out
        if not _is_number(constraint.value):
            return True
        return _range_may_hold(constraint.op, constraint.value, self.low, self.high)

    def covers(self, other: AttributeSummary) -> bool:
        if other.present == 0:
            return True
        if self.present == 0:
            return False
        if other.low is not None and (
            self.low is None or other.low < self.low or other.high > self.high
        ):
            return False
        if self.values is None:
            return True
        return other.values is not None and other.values.keys() <= self.values.keys()


def _range_may_hold(op: str, literal: float, low: float, high: float) -> bool:
    return {
        "<": low < literal,
        "<=": low <= literal,
        ">": high > literal,
        ">=": high >= literal,
        "==": low <= literal <= high,
    }[op]


@dataclass
class Summary:
    """Receivers' attributes and the union of their policies, for one subtree."""

    receivers: int = 0
    attributes: dict[str, AttributeSummary] = field(default_factory=dict)
    policy_filters: list[Filter] = field(default_factory=list)
    # The exact filters that coagulation replaced by `policy_filters`; empty when they
    # were kept as they were (nothing lost) or unknown (a summary read back from JSON).
    replaced: tuple[Filter, ...] = field(default=(), compare=False, repr=False)

    @classmethod
    def of_receivers(cls, receivers: Iterable[tuple[Mapping[str, Any], Policy]]) -> Summary:
        """The exact summary of some receivers, its policy union coagulated."""
        summary, filters = cls(), set()
        for attributes, policy in receivers:
            summary.receivers += 1
            for name, value in attributes.items():
                summary.attributes.setdefault(name, AttributeSummary()).add(value)
            filters.update(policy.filters())
        summary.policy_filters, summary.replaced = _coagulated(filters)
        return summary

    @classmethod
    def union(cls, parts: Iterable[Summary]) -> Summary:
        """A summary covering every part (a parent's view of its children)."""
        summary, filters = cls(), set()
        for part in parts:
            summary.receivers += part.receivers
            for name, attribute in part.attributes.items():
                mine = summary.attributes.setdefault(name, AttributeSummary())
                mine.merge(attribute)
            filters.update(part.policy_filters)
        summary.policy_filters, summary.replaced = _coagulated(filters)
        return summary

    def with_moved_numbers_as_ranges(self, kept: Summary) -> Summary:
        """This summary, but an attribute that lists numbers `kept` did not list as its
        range alone: a summary that grows because a measured value moved (a load in a
        subtree small enough to list its values) then covers the next values within
        its range instead of growing, a new version and a parent's refresh, at every
        report; the periodic recomputation lists them exactly again. Wider than this
        summary, never narrower: it lets through all that this one does."""
        attributes = {
            name: replace(attribute, values=None)
            if attribute.lists_numbers_beyond(kept.attributes.get(name))
            else attribute
            for name, attribute in self.attributes.items()
        }
        return replace(self, attributes=attributes)

    def may_accept(self, sender: Mapping[str, Any], content: Mapping[str, Any]) -> bool:
        return any(f.accepts(sender, content) for f in self.policy_filters)

    def accepts_all_of(self, other: Summary) -> bool:
        """Does this summary's policy side let through every sender and content that
        `other`'s does? (sound: False when unsure)"""
        return covers_all(self.policy_filters, other.policy_filters)

    def may_select(self, selector: Selector | None) -> bool:
        if self.receivers == 0:
            return False
        if selector is None:
            return True
        return any(self._may_satisfy(f) for f in selector.filters())

    def may_match(self, selector: Selector | None, sender: Mapping, content: Mapping) -> bool:
        """May some receiver below get this event?"""
        return self.may_accept(sender, content) and self.may_select(selector)

    def _may_satisfy(self, selector_filter: Filter) -> bool:
        return all(self._may_hold(c) for c in selector_filter.constraints)

    def _may_hold(self, constraint) -> bool:
        attribute = self.attributes.get(constraint.name, AttributeSummary())
        missing_somewhere = attribute.present < self.receivers
        if constraint.op == "exists":
            return attribute.present > 0
        if constraint.op == "not exists":
            return missing_somewhere
        if constraint.negated and missing_somewhere:
            return True  # a negated test holds on a missing attribute
        return attribute.may_hold(constraint)

    def covers(self, other: Summary) -> bool:
        """Does this summary let through everything `other` lets through?"""
        if other.receivers == 0:
            return True
        if self.receivers == 0 or not covers_all(self.policy_filters, other.policy_filters):
            return False
        return all(
            self.attributes.get(name, AttributeSummary()).covers(attribute)
            and self._absent_covers(name, other)
            for name, attribute in other.attributes.items()
        ) and self._new_names_are_covered(other)

    def _absent_covers(self, name: str, other: Summary) -> bool:
        # `not exists` may hold below `other`; it must be allowed by us as well.
        other_missing = other.attributes[name].present < other.receivers
        mine = self.attributes.get(name, AttributeSummary())
        return not other_missing or mine.present < self.receivers

    def _new_names_are_covered(self, other: Summary) -> bool:
        # Attributes we know but `other` lacks: its receivers miss them entirely.
        return all(
            attribute.present < self.receivers
            for name, attribute in self.attributes.items()
            if name not in other.attributes
        )

    def figures(self, sample: Callable[[], Iterable[Mapping[str, Any]]]) -> dict[str, int]:
        """What this summary's policy costs and what coagulation lost to reach it, as
        DispatcherSummary's columns keep them. `sample` gives policy inputs (recent
        events as scopes); it is only called when coagulation replaced filters, since
        the loss is otherwise nil."""
        filters = self.policy_filters
        loss = over_acceptance(self.replaced, filters, sample()) if self.replaced else None
        return {
            "filters": len(filters),
            "constraints": sum(len(f) for f in filters),
            "exact_filters": len(self.replaced) or len(filters),
            "loss_sampled": loss.samples if loss else 0,
            "loss_extra": loss.extra if loss else 0,
        }

    def to_json(self) -> dict:
        return {
            "receivers": self.receivers,
            "policy": f"accept {filters_text(self.policy_filters)}",
            "attributes": {name: _attribute_json(a) for name, a in self.attributes.items()},
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any], words: Vocabulary) -> Summary:
        """The summary `to_json` stored. Its policy text is typed by the vocabulary
        again, so that a version literal is a version, not text, as it was in memory."""
        return cls(
            receivers=data["receivers"],
            attributes={n: _attribute_from_json(a) for n, a in data["attributes"].items()},
            policy_filters=_typed_filters(data["policy"], words),
        )


def _typed_filters(text: str, words: Vocabulary) -> list[Filter]:
    try:
        return words.policy(text).filters()
    except PolicySyntaxError:
        # Cannot happen while names keep their types; should it, over-approximate
        # (let every event down to the exact check at the leaves), never under.
        log.error("a stored summary no longer type-checks; it lets everything through")
        return words.policy("accept true").filters()


def _coagulated(filters: set[Filter]) -> tuple[list[Filter], tuple[Filter, ...]]:
    """(at most MAX_POLICY_FILTERS filters covering `filters`, the exact filters they
    replaced or () when none was)."""
    ordered = sorted(filters, key=Filter.text)
    if len(ordered) <= MAX_POLICY_FILTERS:
        return ordered, ()
    return coagulate(ordered, MAX_POLICY_FILTERS), tuple(ordered)


def _attribute_json(attribute: AttributeSummary) -> dict:
    values = None if attribute.values is None else sorted(attribute.values.values(), key=repr)
    return {
        "present": attribute.present,
        "values": values,
        "low": attribute.low,
        "high": attribute.high,
    }


def _attribute_from_json(data: Mapping[str, Any]) -> AttributeSummary:
    values = None if data["values"] is None else {_key(v): v for v in data["values"]}
    return AttributeSummary(data["present"], values, data["low"], data["high"])
