"""Covering: does filter ``a`` accept everything filter ``b`` accepts?

``covers(a, b)`` is *sound*: it returns True only when that is certain. It
may answer False when unsure (the dispatcher tree then forwards a little
more than necessary, never less). It reasons attribute by attribute: each
constraint of ``a`` must follow from what ``b`` says about that attribute.

What ``b`` says about one attribute is summarised as ``Facts``: whether the
attribute must be present or missing, the run-time kind it must have, an
interval per comparison domain, a finite set of candidate values (from
``==``/``in``) and text facts (prefixes, suffixes, substrings). Ranges,
equality, ``in`` sets, ``exists``, prefixes and simple globs are complete
enough for the common cases; exotic globs fall back to "not sure".
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from policies.expressions import Constraint
from policies.filters import Filter
from policies.types import (
    BOOL,
    GLOB_METACHARACTERS,
    PATTERN_OPS,
    Version,
    comparable,
    glob_literal_prefix,
    literal_domain,
    runtime_kind,
)

_INTERVAL_OPS = frozenset({"==", "<", "<=", ">", ">="})


@dataclass(frozen=True)
class Interval:
    """Values between ``low`` and ``high`` (None = unbounded) in one domain."""

    low: Any = None
    low_inclusive: bool = False
    high: Any = None
    high_inclusive: bool = False

    def intersect(self, other: Interval) -> Interval:
        """Values in both intervals."""
        low, low_inc = _tighter(self.low, self.low_inclusive, other.low, other.low_inclusive, 1)
        high, high_inc = _tighter(
            self.high, self.high_inclusive, other.high, other.high_inclusive, -1
        )
        return Interval(low, low_inc, high, high_inc)

    def is_empty(self) -> bool:
        """No value lies in the interval."""
        if self.low is None or self.high is None:
            return False
        if self.low == self.high:
            return not (self.low_inclusive and self.high_inclusive)
        return self.low > self.high

    def contains_interval(self, inner: Interval) -> bool:
        """Every value of ``inner`` is in this interval."""
        return _bound_within(self.low, self.low_inclusive, inner.low, inner.low_inclusive, 1) and (
            _bound_within(self.high, self.high_inclusive, inner.high, inner.high_inclusive, -1)
        )

    def contains(self, value: Any) -> bool:
        """``value`` (already comparable) lies in the interval."""
        return self.contains_interval(Interval(value, True, value, True))


def _tighter(a: Any, a_inc: bool, b: Any, b_inc: bool, sign: int) -> tuple[Any, bool]:
    """The tighter of two bounds: larger low (sign=1) or smaller high (sign=-1)."""
    if a is None:
        return b, b_inc
    if b is None or a == b:
        return a, a_inc and (b_inc if b is not None else True)
    return (a, a_inc) if (a > b) == (sign == 1) else (b, b_inc)


def _bound_within(outer: Any, outer_inc: bool, inner: Any, inner_inc: bool, sign: int) -> bool:
    if outer is None:
        return True
    if inner is None:
        return False
    if inner == outer:
        return outer_inc or not inner_inc
    return (inner > outer) == (sign == 1)


def constraint_interval(constraint: Constraint) -> tuple[str, Interval] | None:
    """Domain and interval of values a positive comparison accepts, if it has one."""
    if constraint.op not in _INTERVAL_OPS or literal_domain(constraint.value) == BOOL:
        return None
    value = comparable(constraint.value)
    interval = {
        "==": Interval(value, True, value, True),
        "<": Interval(high=value),
        "<=": Interval(high=value, high_inclusive=True),
        ">": Interval(low=value),
        ">=": Interval(low=value, low_inclusive=True),
    }[constraint.op]
    return literal_domain(constraint.value), interval


def forced_kind(constraint: Constraint) -> str | None:
    """Run-time kind (number/text/bool) a positive constraint requires, if one."""
    if constraint.op in PATTERN_OPS:
        return "text"
    if constraint.op == "in":
        kinds = {runtime_kind(literal_domain(item)) for item in constraint.value}
        return kinds.pop() if len(kinds) == 1 else None
    return runtime_kind(literal_domain(constraint.value))


def forces_version(constraint: Constraint) -> bool:
    """The constraint only holds on strings that parse as versions."""
    values = constraint.value if constraint.op == "in" else (constraint.value,)
    return constraint.op not in PATTERN_OPS and all(isinstance(v, Version) for v in values)


# ---------------------------------------------------------------------------
# Facts: what a conjunction says about one attribute.


@dataclass
class Facts:
    """Summary of the constraints of one filter on one attribute."""

    constraints: frozenset[Constraint]
    present: bool = False
    missing: bool = False
    positives: list[Constraint] = field(default_factory=list)
    negatives: list[Constraint] = field(default_factory=list)
    kinds: set[str] = field(default_factory=set)
    intervals: dict[str, Interval] = field(default_factory=dict)
    candidates: list[Any] | None = None
    texts: list[tuple[str, str]] = field(default_factory=list)

    def unsatisfiable(self) -> bool:
        """No value (nor absence) satisfies all the constraints."""
        if self.missing and self.present:
            return True
        if self.candidates == [] or len(self.kinds) > 1:
            return True
        if any(interval.is_empty() for interval in self.intervals.values()):
            return True
        return any(c.negate() in self.constraints for c in self.constraints)


def facts_of(constraints: Iterable[Constraint]) -> Facts:
    """Summarise constraints that are all on the same attribute."""
    facts = Facts(frozenset(constraints))
    for constraint in facts.constraints:
        _absorb(facts, constraint)
    facts.candidates = _candidates(facts)
    return facts


def _absorb(facts: Facts, constraint: Constraint) -> None:
    if constraint.op == "not exists":
        facts.missing = True
    elif constraint.negated:
        facts.negatives.append(constraint.positive())
    elif constraint.op == "exists":
        facts.present = True
    else:
        facts.present = True
        facts.positives.append(constraint)
        _absorb_positive(facts, constraint)


def _absorb_positive(facts: Facts, constraint: Constraint) -> None:
    kind = forced_kind(constraint)
    if kind is not None:
        facts.kinds.add(kind)
    ranged = constraint_interval(constraint)
    if ranged is not None:
        domain, interval = ranged
        current = facts.intervals.get(domain)
        facts.intervals[domain] = interval if current is None else current.intersect(interval)
    facts.texts.extend(text_facts(constraint))


def _candidates(facts: Facts) -> list[Any] | None:
    """Finite set of values the attribute can take, if ``==``/``in`` pins it down.

    Version literals are left out: many strings ("2.4", "2.4.0") share one
    version, so checking the literal alone would not be exact.
    """
    for constraint in facts.positives:
        if constraint.op not in ("==", "in"):
            continue
        values = constraint.value if constraint.op == "in" else (constraint.value,)
        if any(isinstance(value, Version) for value in values):
            return None
        return [v for v in values if all(c.holds_on(v) for c in facts.constraints)]
    return None


def text_facts(constraint: Constraint) -> list[tuple[str, str]]:
    """``("prefix"|"suffix"|"contains", text)`` facts a positive constraint implies."""
    if constraint.op == "startswith":
        return [("prefix", constraint.value)]
    if constraint.op == "endswith":
        return [("suffix", constraint.value)]
    if constraint.op == "contains":
        return [("contains", constraint.value)]
    if constraint.op == "~":
        return _glob_facts(constraint.value)
    return []


def _glob_facts(pattern: str) -> list[tuple[str, str]]:
    facts = [("prefix", glob_literal_prefix(pattern))]
    if "[" not in pattern:
        cut = max(pattern.rfind("*"), pattern.rfind("?"))
        facts.append(("suffix", pattern[cut + 1 :]))
    return facts


def glob_requirement(pattern: str) -> tuple[str, str]:
    """A glob as a simpler text requirement when it is one, else ``("glob", pattern)``."""
    if not GLOB_METACHARACTERS & set(pattern):
        return ("exact", pattern)
    if "[" in pattern or "?" in pattern:
        return ("glob", pattern)
    core = pattern.strip("*")
    if "*" in core:
        return ("glob", pattern)
    if not core:
        return ("any", "")
    starts, ends = pattern.startswith("*"), pattern.endswith("*")
    if starts and ends:
        return ("contains", core)
    return ("suffix", core) if starts else ("prefix", core)


# ---------------------------------------------------------------------------
# Implication


def covers(a: Filter, b: Filter) -> bool:
    """True only if every input accepted by ``b`` is accepted by ``a``."""
    if a.constraints <= b.constraints:
        return True
    facts_by_attribute = _facts_by_attribute(b)
    if any(facts.unsatisfiable() for facts in facts_by_attribute.values()):
        return True
    empty = Facts(frozenset())
    return all(
        implied(constraint, facts_by_attribute.get(constraint.attribute, empty))
        for constraint in a.constraints - b.constraints
    )


def covers_all(covering: Sequence[Filter], covered: Iterable[Filter]) -> bool:
    """Every filter of ``covered`` is covered by some filter of ``covering`` (sound)."""
    return all(any(covers(a, b) for a in covering) for b in covered)


def _facts_by_attribute(f: Filter) -> dict[tuple[str, str], Facts]:
    grouped: dict[tuple[str, str], list[Constraint]] = {}
    for constraint in f.constraints:
        grouped.setdefault(constraint.attribute, []).append(constraint)
    return {attribute: facts_of(group) for attribute, group in grouped.items()}


def implied(constraint: Constraint, facts: Facts) -> bool:
    """Does every value satisfying ``facts`` satisfy ``constraint``? (sound)"""
    if constraint in facts.constraints:
        return True
    if constraint.op == "exists":
        return facts.present
    if constraint.op == "not exists":
        return facts.missing
    if constraint.negated:
        return _negation_implied(constraint.positive(), facts)
    if facts.missing or not facts.present:
        return False  # the attribute may be missing, where a positive constraint fails
    if facts.candidates is not None:
        return all(constraint.holds_on(value) for value in facts.candidates)
    return _positive_implied(constraint, facts)


def _positive_implied(constraint: Constraint, facts: Facts) -> bool:
    if constraint.op in PATTERN_OPS:
        return _text_implied(constraint, facts)
    if constraint.op == "!=":
        return _inequality_implied(constraint, facts)
    ranged = constraint_interval(constraint)
    if ranged is None:
        return False
    domain, interval = ranged
    known = facts.intervals.get(domain)
    return known is not None and interval.contains_interval(known)


def _inequality_implied(constraint: Constraint, facts: Facts) -> bool:
    """``x != v`` follows if ``x`` is surely of v's domain and surely not v."""
    value = constraint.value
    domain = literal_domain(value)
    known = facts.intervals.get(domain)
    if known is not None and not known.contains(comparable(value)):
        return True
    return any(
        _guarantees_domain(positive, domain) and not positive.test_value(value)
        for positive in facts.positives
    )


def _guarantees_domain(constraint: Constraint, domain: str) -> bool:
    if domain == "version":
        return forces_version(constraint)
    return forced_kind(constraint) == domain


def _text_implied(constraint: Constraint, facts: Facts) -> bool:
    kind, text = (
        glob_requirement(constraint.value) if constraint.op == "~" else text_facts(constraint)[0]
    )
    if kind == "any":
        return "text" in facts.kinds
    checks = {
        "prefix": lambda fact, known: fact == "prefix" and known.startswith(text),
        "suffix": lambda fact, known: fact == "suffix" and known.endswith(text),
        "contains": lambda fact, known: text in known,
    }
    check = checks.get(kind)
    return check is not None and any(check(fact, known) for fact, known in facts.texts)


def _negation_implied(positive: Constraint, facts: Facts) -> bool:
    """Does ``not positive`` follow from the facts?"""
    if facts.missing:
        return True
    single = facts_of([positive])
    if any(implied(negative, single) for negative in facts.negatives):
        return True  # positive => negative, so not negative => not positive
    return facts.present and _excluded(positive, facts)


def _excluded(positive: Constraint, facts: Facts) -> bool:
    """No value allowed by the facts satisfies ``positive``."""
    if facts.candidates is not None:
        return not any(positive.test_value(value) for value in facts.candidates)
    kind = forced_kind(positive)
    if kind is not None and facts.kinds and kind not in facts.kinds:
        return True
    ranged = constraint_interval(positive)
    if ranged is None:
        return False
    domain, interval = ranged
    known = facts.intervals.get(domain)
    return known is not None and known.intersect(interval).is_empty()
