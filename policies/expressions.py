"""The expression tree of policies and selectors: immutable, hashable, equal by structure.

Evaluation rule used everywhere (AST, filters, matcher, covering):

* a constraint on a missing attribute is false; only ``x not exists`` is true
  on it (``None`` counts as missing);
* a constraint on a value of the wrong type is false, never an exception;
* ``not e`` is the plain logical negation of ``e`` under those rules, so
  ``not (x == 1)`` is TRUE when ``x`` is missing, while ``x != 1`` is false.

Expressions are evaluated against *scopes*: ``{"sender": ..., "event": ...}``
for policies and ``{"receiver": ...}`` for selectors.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from policies.types import (
    Literal,
    ValueTest,
    Version,
    compile_test,
    format_literal,
)

Scopes: TypeAlias = Mapping[str, Mapping[str, Any] | None]

SENDER, EVENT, RECEIVER = "sender", "event", "receiver"
POLICY_SCOPES = (SENDER, EVENT)
SELECTOR_SCOPES = (RECEIVER,)

# Words the grammar reserves: a bare selector name equal to one of them is
# written with its ``receiver.`` scope so that canonical text parses back.
KEYWORDS = frozenset(
    {
        *("accept", "or", "and", "not", "in", "exists", "true", "false"),
        *("startswith", "endswith", "contains"),
    }
)

_OP_ORDER = {
    op: index
    for index, op in enumerate(
        [
            *("exists", "not exists", "==", "!=", ">", ">=", "<", "<=", "in", "~"),
            *("startswith", "endswith", "contains"),
        ]
    )
}


class Expression:
    """Base class of expression nodes."""

    __slots__ = ()

    def evaluate(self, scopes: Scopes) -> bool:
        """Truth of the expression on the given attribute scopes."""
        raise NotImplementedError

    def text(self) -> str:
        """Canonical text; parses back to an equal expression."""
        raise NotImplementedError

    def __str__(self) -> str:
        return self.text()


def _typed(value: Any) -> Any:
    """Structural key of a literal that keeps ``1``, ``1.0`` and ``true`` apart."""
    if isinstance(value, tuple):
        return tuple(_typed(item) for item in value)
    if isinstance(value, Version):
        return ("version", value.text)
    return (type(value).__name__, value)


@dataclass(frozen=True, eq=False)
class Constraint(Expression):
    """``scope.name op value``; ``negated`` only appears in filters (DNF)."""

    scope: str
    name: str
    op: str
    value: Literal | tuple[Literal, ...] | None = None
    negated: bool = False
    _key: tuple[Any, ...] = field(init=False, repr=False)
    _hash: int = field(init=False, repr=False)
    _test: ValueTest | None = field(init=False, repr=False)

    def __post_init__(self) -> None:
        key = (self.scope, self.name, self.op, _typed(self.value), self.negated)
        object.__setattr__(self, "_key", key)
        object.__setattr__(self, "_hash", hash(key))
        needs_test = self.op not in ("exists", "not exists")
        object.__setattr__(self, "_test", compile_test(self.op, self.value) if needs_test else None)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Constraint) and self._key == other._key

    def __hash__(self) -> int:
        return self._hash

    @property
    def attribute(self) -> tuple[str, str]:
        """``(scope, name)``: the attribute this constraint is about."""
        return (self.scope, self.name)

    def holds_on(self, value: Any) -> bool:
        """Truth of the constraint for an attribute value (``None`` = missing)."""
        if self.op == "exists":
            return value is not None
        if self.op == "not exists":
            return value is None
        positive = value is not None and self._test(value)  # type: ignore[misc]
        return positive != self.negated

    def test_value(self, value: Any) -> bool:
        """Positive test on a present value, ignoring ``negated`` (for covering)."""
        if self.op in ("exists", "not exists"):
            return self.op == "exists"
        return self._test(value)  # type: ignore[misc]

    def evaluate(self, scopes: Scopes) -> bool:
        attributes = scopes.get(self.scope)
        return self.holds_on(attributes.get(self.name) if attributes else None)

    def negate(self) -> Constraint:
        """The exact logical complement, as a constraint."""
        if self.op in ("exists", "not exists"):
            flipped = "not exists" if self.op == "exists" else "exists"
            return Constraint(self.scope, self.name, flipped)
        return Constraint(self.scope, self.name, self.op, self.value, not self.negated)

    def positive(self) -> Constraint:
        """This constraint without its negation flag."""
        return self.negate() if self.negated else self

    def qualified_name(self) -> str:
        """The name as written: bare for receivers (unless a keyword), scoped otherwise."""
        if self.scope == RECEIVER and self.name not in KEYWORDS:
            return self.name
        return f"{self.scope}.{self.name}"

    def text(self) -> str:
        body = f"{self.qualified_name()} {self.op}"
        if self.op == "in":
            items = ", ".join(format_literal(item) for item in self.value)  # type: ignore[union-attr]
            body = f"{body} [{items}]"
        elif self.op not in ("exists", "not exists"):
            body = f"{body} {format_literal(self.value)}"  # type: ignore[arg-type]
        return f"not {body}" if self.negated else body

    def sort_key(self) -> tuple[Any, ...]:
        """Order used for canonical text: by attribute, then operator, then text."""
        return (self.scope, self.name, _OP_ORDER.get(self.op, 99), self.negated, self.text())


@dataclass(frozen=True)
class Always(Expression):
    """The constant ``true`` or ``false``."""

    value: bool

    def evaluate(self, scopes: Scopes) -> bool:
        return self.value

    def text(self) -> str:
        return "true" if self.value else "false"


@dataclass(frozen=True)
class Not(Expression):
    """Logical negation of a sub-expression."""

    operand: Expression

    def evaluate(self, scopes: Scopes) -> bool:
        return not self.operand.evaluate(scopes)

    def text(self) -> str:
        inner = self.operand.text()
        if isinstance(self.operand, Constraint | Always | Not):
            return f"not {inner}"
        return f"not ({inner})"


@dataclass(frozen=True)
class And(Expression):
    """Conjunction of two or more operands (nested conjunctions are flattened)."""

    operands: tuple[Expression, ...]

    def evaluate(self, scopes: Scopes) -> bool:
        return all(operand.evaluate(scopes) for operand in self.operands)

    def text(self) -> str:
        # ``and`` binds tighter than ``or``: only an Or operand needs parentheses.
        return " and ".join(
            f"({operand.text()})" if isinstance(operand, Or) else operand.text()
            for operand in self.operands
        )


@dataclass(frozen=True)
class Or(Expression):
    """Disjunction of two or more operands (nested disjunctions are flattened)."""

    operands: tuple[Expression, ...]

    def evaluate(self, scopes: Scopes) -> bool:
        return any(operand.evaluate(scopes) for operand in self.operands)

    def text(self) -> str:
        return " or ".join(operand.text() for operand in self.operands)


def conjunction(operands: Iterable[Expression]) -> Expression:
    """``And`` of the operands, flattened; a single operand is returned as is."""
    return _combine(And, operands, Always(True))


def disjunction(operands: Iterable[Expression]) -> Expression:
    """``Or`` of the operands, flattened; a single operand is returned as is."""
    return _combine(Or, operands, Always(False))


def _combine(kind: type[And] | type[Or], operands: Iterable[Expression], empty: Always):
    flat: list[Expression] = []
    for operand in operands:
        flat.extend(operand.operands if isinstance(operand, kind) else (operand,))
    if not flat:
        return empty
    return flat[0] if len(flat) == 1 else kind(tuple(flat))
