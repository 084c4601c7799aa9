"""Why a selector or a policy holds or not, clause by clause, with the values tested.

A rule is explained in its minimal disjunctive normal form, the form the matcher
evaluates: it holds if any branch holds, and a branch holds if every constraint in it
holds. Each constraint is shown with the value it was tested on ("missing" when the
attribute is absent), so an operator sees which clause refused and on what.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from policies.expressions import EVENT, RECEIVER, SENDER, Constraint
from policies.filters import Filter
from policies.rules import Policy, Selector
from policies.types import format_literal


@dataclass(frozen=True)
class ClauseCheck:
    """One constraint and the value it was tested on (None: the attribute is missing)."""

    text: str
    scope: str
    name: str
    attribute: str  # as the language writes it: `sender.trust`, bare `region`
    value: Any
    holds: bool

    @property
    def value_text(self) -> str:
        """The tested value as the language writes it, or "missing"."""
        return "missing" if self.value is None else describe_value(self.value)

    def __str__(self) -> str:
        return f"{self.text} ({self.attribute} is {self.value_text})"


@dataclass(frozen=True)
class BranchCheck:
    """One branch of the rule: it holds if every one of its constraints holds."""

    text: str
    checks: tuple[ClauseCheck, ...]

    @property
    def holds(self) -> bool:
        return all(check.holds for check in self.checks)

    @property
    def failing(self) -> tuple[ClauseCheck, ...]:
        """The constraints that did not hold."""
        return tuple(check for check in self.checks if not check.holds)


@dataclass(frozen=True)
class Verdict:
    """A rule's outcome: every branch checked, the first that held (if any)."""

    holds: bool
    branches: tuple[BranchCheck, ...]

    @property
    def clause(self) -> str | None:
        """The text of the first branch that held."""
        return next((branch.text for branch in self.branches if branch.holds), None)

    @property
    def failures(self) -> tuple[str, ...]:
        """Each failed branch, with the constraints that failed it and their values."""
        if self.holds:
            return ()
        if not self.branches:
            return ("it accepts nothing",)
        return tuple(
            f"({branch.text}) fails on {', '.join(str(c) for c in branch.failing)}"
            for branch in self.branches
        )

    @property
    def reason(self) -> str:
        """One line saying why the rule did not hold ("" if it did)."""
        return "; ".join(self.failures)


def check_filters(filters: list[Filter], scopes: Mapping[str, Any]) -> Verdict:
    """Check every branch of a rule given as filters against `scopes`."""
    branches = tuple(_branch(f, scopes) for f in filters)
    return Verdict(any(branch.holds for branch in branches), branches)


def check_policy(
    policy: Policy, sender: Mapping[str, Any] | None, content: Mapping[str, Any] | None
) -> Verdict:
    """Does `policy` accept this sender (its attested attributes) and content, and why."""
    return check_filters(policy.filters(), {SENDER: sender or {}, EVENT: content or {}})


def admits_sender(filters: Iterable[Filter], sender: Mapping[str, Any] | None) -> bool:
    """Does some branch of a policy (its filters) hold on the sender's attributes, its
    clauses on the event content aside? False: the policy refuses this sender whatever
    it sends. One pass over the sender's clauses, no verdicts built."""
    scopes = {SENDER: sender or {}}
    return any(all(c.evaluate(scopes) for c in f.constraints if c.scope == SENDER) for f in filters)


def check_selector(selector: Selector | None, receiver: Mapping[str, Any] | None) -> Verdict:
    """Does `selector` select a receiver with these attributes, and why. No selector
    selects everyone (one empty branch)."""
    filters = selector.filters() if selector is not None else [Filter()]
    return check_filters(filters, {RECEIVER: receiver or {}})


def _branch(f: Filter, scopes: Mapping[str, Any]) -> BranchCheck:
    return BranchCheck(f.text(), tuple(_check(c, scopes) for c in f.sorted_constraints()))


def _check(constraint: Constraint, scopes: Mapping[str, Any]) -> ClauseCheck:
    attributes = scopes.get(constraint.scope) or {}
    value = attributes.get(constraint.name)
    return ClauseCheck(
        text=constraint.text(),
        scope=constraint.scope,
        name=constraint.name,
        attribute=constraint.qualified_name(),
        value=value,
        holds=constraint.evaluate(scopes),
    )


def describe_value(value: Any) -> str:
    """A value as the language writes it; anything else as Python shows it."""
    try:
        return format_literal(value)
    except (TypeError, ValueError):
        return repr(value)


@dataclass(frozen=True)
class Explanation:
    """Which selector clause and which policy clause decided a delivery, in words."""

    receiver_id: Hashable
    no_selector: bool
    selector: Verdict
    policy: Verdict

    @property
    def delivered(self) -> bool:
        """Would the matcher deliver the event to this receiver?"""
        return self.selector.holds and self.policy.holds

    def __str__(self) -> str:
        outcome = "receives" if self.delivered else "does not receive"
        return f"{self.receiver_id} {outcome} the event: {self._selector_words()}; " + (
            self._policy_words()
        )

    def _selector_words(self) -> str:
        if self.no_selector:
            return "the event has no selector, every receiver is a candidate"
        if self.selector.holds:
            return f"the selector matches through ({self.selector.clause})"
        return "the selector does not match: " + self.selector.reason

    def _policy_words(self) -> str:
        if self.policy.holds:
            return f"its policy accepts through ({self.policy.clause})"
        return "its policy refuses: " + self.policy.reason
