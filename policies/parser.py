"""Parse policy and selector text into expressions, with operator-friendly errors.

Scoping rules (decided here, enforced with a positioned PolicySyntaxError):

* a **policy** starts with ``accept`` and every name is scoped ``sender.x`` or
  ``event.x``; a bare name is an error because it is ambiguous (does ``region``
  mean the sender's or the event's?);
* a **selector** names receiver attributes, bare (``load``) or as
  ``receiver.load``; ``sender.`` / ``event.`` in a selector is an error: a
  selector can only look at receivers;
* ``true`` and ``false`` are expressions too: ``accept true`` accepts
  everything, ``accept false`` nothing. ``accept`` alone is an error;
* a bare attribute as a condition (``cgi``, ``receiver.cgi``) is shorthand for
  ``cgi == true``.

With a model (``{name: type}``) per scope, unknown attributes (with a close match
suggested), literals that do not fit the declared type and the shorthand on a
non-bool attribute raise PolicyTypeError at the offending position.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from functools import lru_cache
from importlib import resources
from typing import Any, TypeAlias

from lark import Lark, Token, Tree
from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken

from policies.errors import PolicySyntaxError, PolicyTypeError
from policies.expressions import (
    EVENT,
    POLICY_SCOPES,
    RECEIVER,
    SENDER,
    Always,
    Constraint,
    Expression,
    Not,
    conjunction,
    disjunction,
)
from policies.filters import FilterExplosion
from policies.rules import Policy, Selector
from policies.types import (
    ORDERING_OPS,
    PATTERN_OPS,
    TYPE_DEFINITIONS,
    AttributeType,
    LiteralMismatch,
    check_truth_shorthand,
    fit_literal,
    normalize_model,
    parse_number,
)

_Models: TypeAlias = Mapping[str, Mapping[str, AttributeType] | None]

MAX_NESTING = 64  # deeper than any sane policy; keeps evaluation recursion safe
MAX_FILTERS = 1024  # a policy expanding to more alternatives is refused as too complex


@lru_cache(maxsize=1)
def _lark() -> Lark:
    grammar = resources.files("policies").joinpath("grammar.lark").read_text(encoding="utf-8")
    return Lark(
        grammar,
        start=["policy", "selector"],
        parser="lalr",
        propagate_positions=True,
        maybe_placeholders=False,
    )


def parse_policy(
    text: str,
    *,
    sender_model: Mapping[str, Any] | None = None,
    event_model: Mapping[str, Any] | None = None,
) -> Policy:
    """Parse ``accept ...`` text; models, when given, type-check the constraints."""
    models = {SENDER: normalize_model(sender_model), EVENT: normalize_model(event_model)}
    tree = _parse_tree(text, "policy", models)
    builder = _Builder(allowed_scopes=POLICY_SCOPES, models=models)
    policy = Policy(builder.expression(tree.children[1], depth=0))
    _check_complexity(policy)
    return policy


def parse_selector(text: str, *, receiver_model: Mapping[str, Any] | None = None) -> Selector:
    """Parse a selector over receiver attributes (bare names or ``receiver.x``)."""
    models = {RECEIVER: normalize_model(receiver_model)}
    tree = _parse_tree(text, "selector", models)
    builder = _Builder(allowed_scopes=(RECEIVER,), models=models)
    selector = Selector(builder.expression(tree.children[0], depth=0))
    _check_complexity(selector)
    return selector


def _check_complexity(rule: Policy | Selector) -> None:
    try:
        rule.filters()
    except FilterExplosion:
        reason = f"expression too complex: it expands to more than {MAX_FILTERS} alternatives"
        raise PolicySyntaxError(reason, 1, 1) from None


# ---------------------------------------------------------------------------
# Lark errors translated into words.


def _parse_tree(text: str, start: str, models: _Models) -> Tree:
    if not isinstance(text, str):
        raise PolicySyntaxError("expected text", 1, 1)
    try:
        return _lark().parse(text, start=start)
    except UnexpectedInput as error:
        raise _translate(error, text, start, models) from None


_PHRASES = [
    ({"ACCEPT"}, "'accept'"),
    ({"NAME"}, "an attribute name"),
    ({"NOT"}, "'not'"),
    ({"LPAR"}, "'('"),
    ({"STRING", "NUMBER", "TRUE", "FALSE"}, "a value"),
    (
        {"EQ", "NE", "LT", "LE", "GT", "GE", "GLOB", "STARTSWITH", "ENDSWITH", "CONTAINS"},
        "an operator (==, !=, <, <=, >, >=, ~, startswith, endswith, contains, in, exists)",
    ),
    ({"IN", "EXISTS"}, None),  # covered by the operator phrase
    ({"LSQB"}, "'[' to start a list"),
    ({"COMMA", "RSQB"}, "',' or ']'"),
    ({"AND", "OR"}, "'and' or 'or'"),
    ({"RPAR"}, "')'"),
    ({"$END"}, "the end of the text"),
]


def _describe_expected(expected: set[str], value_phrase: str = "a value") -> str:
    phrases = [phrase for names, phrase in _PHRASES if phrase and names & expected]
    phrases = [value_phrase if phrase == "a value" else phrase for phrase in phrases]
    if "NAME" in expected:
        # Start of a condition: true/false are possible but not worth suggesting.
        phrases = [phrase for phrase in phrases if phrase != "a value"]
    if any(phrase.startswith("an operator") for phrase in phrases):
        phrases = [phrase for phrase in phrases if phrase != "'not'"]
    elif {"IN", "EXISTS"} & expected:
        phrases.append("'in' or 'exists'")
    if not phrases:
        return "something else"
    if len(phrases) == 1:
        return phrases[0]
    return ", ".join(phrases[:-1]) + " or " + phrases[-1]


def _translate(error: UnexpectedInput, text: str, start: str, models: _Models) -> PolicySyntaxError:
    accepted = _tokens_before(text, start)
    after = f" after '{_shorten(str(accepted[-1]))}'" if accepted else ""
    value_phrase = _value_phrase(accepted, start, models)
    if isinstance(error, UnexpectedToken) and error.token.type == "$END":
        line, column = _end_position(text)
        expected = _describe_expected(set(error.expected), value_phrase)
        return PolicySyntaxError(f"expected {expected}{after}", line, column)
    if isinstance(error, UnexpectedToken):
        expected = _describe_expected(set(error.expected), value_phrase)
        found = _shorten(str(error.token))
        return PolicySyntaxError(
            f"expected {expected}{after} but found '{found}'", error.line, error.column
        )
    return _character_error(error, text, after)


def _value_phrase(accepted: list[Token], start: str, models: _Models) -> str:
    """ "a number for 'load'" when the value expected follows `load >=` and a model
    types load: the expected type, in an operator's words."""
    if len(accepted) < 2 or accepted[-2].type != "NAME" or accepted[-1].type not in _VALUE_OPS:
        return "a value"
    written = str(accepted[-2])
    scope, _, name = written.rpartition(".")
    scope = scope or (RECEIVER if start == "selector" else "")
    declared = (models.get(scope) or {}).get(name)
    if declared is None:
        return "a value"
    return f"{TYPE_DEFINITIONS[declared].words} for '{_shorten(written)}'"


_VALUE_OPS = frozenset({"EQ", "NE", "LE", "GE", "LT", "GT"})


def _character_error(error: UnexpectedInput, text: str, after: str) -> PolicySyntaxError:
    assert isinstance(error, UnexpectedCharacters)
    char = text[error.pos_in_stream] if error.pos_in_stream < len(text) else ""
    if char == '"':
        reason = "unterminated text: missing closing '\"'"
        return PolicySyntaxError(reason, error.line, error.column)
    expected = _describe_expected(set(error.allowed or ()))
    return PolicySyntaxError(
        f"expected {expected}{after} but found '{_shorten(char)}'", error.line, error.column
    )


def _shorten(fragment: str) -> str:
    return fragment if len(fragment) <= 30 else fragment[:27] + "..."


def _tokens_before(text: str, start: str) -> list[Token]:
    """The last two tokens the parser accepted before failing (for "after '>='")."""
    parser = _lark().parse_interactive(text, start=start)
    accepted: list[Token] = []
    current: Token | None = None
    try:
        for token in parser.iter_parse():
            if current is not None:
                accepted = [*accepted[-1:], current]
            current = token
    except UnexpectedInput as error:
        # Refused while feeding `current`: the last accepted token is the one before.
        # Refused while lexing the next token: `current` was accepted.
        if isinstance(error, UnexpectedToken) and error.token is current:
            current = None
    return accepted if current is None else [*accepted[-1:], current]


def _end_position(text: str) -> tuple[int, int]:
    """Line and column just after the last meaningful character (comments excluded)."""
    meaningful = _strip_trailing_comments(text)
    line = meaningful.count("\n") + 1
    column = len(meaningful) - (meaningful.rfind("\n") + 1) + 1
    return line, column


def _strip_trailing_comments(text: str) -> str:
    lines = text.split("\n")
    while lines:
        stripped = _without_comment(lines[-1]).rstrip()
        if stripped:
            lines[-1] = stripped
            break
        lines.pop()
    return "\n".join(lines)


def _without_comment(line: str) -> str:
    # A '#' inside a string literal is not a comment.
    in_string = escaped = False
    for index, char in enumerate(line):
        if escaped:
            escaped = False
        elif in_string and char == "\\":
            escaped = True
        elif char == '"':
            in_string = not in_string
        elif char == "#" and not in_string:
            return line[:index]
    return line


# ---------------------------------------------------------------------------
# Tree -> expression.


class _Builder:
    """Builds expressions from the Lark tree, checking scopes and literal types."""

    def __init__(
        self,
        allowed_scopes: tuple[str, ...],
        models: Mapping[str, Mapping[str, AttributeType] | None],
    ) -> None:
        self.allowed_scopes = allowed_scopes
        self.models = models

    def expression(self, node: Tree | Token, depth: int) -> Expression:
        if depth > MAX_NESTING:
            line, column = _position(node)
            raise PolicySyntaxError("expression nested too deeply", line, column)
        kind = node.data if isinstance(node, Tree) else node.type
        return getattr(self, f"_{kind}")(node, depth + 1)

    def _or_expr(self, node: Tree, depth: int) -> Expression:
        return disjunction(self._operands(node, depth))

    def _and_expr(self, node: Tree, depth: int) -> Expression:
        return conjunction(self._operands(node, depth))

    def _operands(self, node: Tree, depth: int) -> list[Expression]:
        return [self.expression(child, depth) for child in node.children[::2]]

    def _negation(self, node: Tree, depth: int) -> Expression:
        return Not(self.expression(node.children[1], depth))

    def _group(self, node: Tree, depth: int) -> Expression:
        return self.expression(node.children[1], depth)

    def _always(self, node: Tree, depth: int) -> Expression:
        return Always(True)

    def _never(self, node: Tree, depth: int) -> Expression:
        return Always(False)

    def _comparison(self, node: Tree, depth: int) -> Expression:
        name_token, op_token, value_node = node.children
        scope, name = self._attribute(name_token)
        literal = _literal(value_node.children[0])
        _check_operator_fits_literal(str(op_token), literal, value_node)
        literal = self._fit(scope, name, str(op_token), literal, value_node)
        return Constraint(scope, name, str(op_token), literal)

    def _membership(self, node: Tree, depth: int) -> Expression:
        scope, name = self._attribute(node.children[0])
        values = [child for child in node.children[3:-1] if isinstance(child, Tree)]
        literals = tuple(
            self._fit(scope, name, "in", _literal(value.children[0]), value) for value in values
        )
        return Constraint(scope, name, "in", literals)

    def _truth(self, node: Tree, depth: int) -> Expression:
        token = node.children[0]
        scope, name = self._attribute(token)
        model = self.models.get(scope)
        if model is not None:
            try:
                check_truth_shorthand(model[name], str(token))
            except LiteralMismatch as mismatch:
                raise PolicyTypeError(str(mismatch), token.line, token.column) from None
        return Constraint(scope, name, "==", True)

    def _existence(self, node: Tree, depth: int) -> Expression:
        scope, name = self._attribute(node.children[0])
        op = "not exists" if len(node.children) == 3 else "exists"
        return Constraint(scope, name, op)

    def _attribute(self, token: Token) -> tuple[str, str]:
        parts = str(token).split(".")
        if len(parts) == 1:
            return self._bare_name(token)
        if len(parts) > 2 or parts[0] not in self.allowed_scopes:
            raise PolicySyntaxError(self._scope_advice(token), token.line, token.column)
        scope, name = parts
        self._check_known(scope, name, token)
        return scope, name

    def _bare_name(self, token: Token) -> tuple[str, str]:
        if self.allowed_scopes != (RECEIVER,):
            reason = (
                f"attribute '{token}' needs a scope in a policy: "
                f"write sender.{token} or event.{token}"
            )
            raise PolicySyntaxError(reason, token.line, token.column)
        self._check_known(RECEIVER, str(token), token)
        return RECEIVER, str(token)

    def _scope_advice(self, token: Token) -> str:
        if self.allowed_scopes == (RECEIVER,):
            return (
                f"a selector can only name receiver attributes: "
                f"write '{token.split('.')[-1]}' or 'receiver.{token.split('.')[-1]}', "
                f"not '{token}'"
            )
        return f"unknown scope in '{token}': a policy names sender.x or event.x attributes"

    def _check_known(self, scope: str, name: str, token: Token) -> None:
        model = self.models.get(scope)
        if model is not None and name not in model:
            reason = f"unknown attribute '{token}': {_known_names(scope, model)}"
            close = difflib.get_close_matches(name, list(model), n=1)
            if close:
                written = close[0] if "." not in token else f"{scope}.{close[0]}"
                reason += f"; did you mean '{written}'?"
            raise PolicyTypeError(reason, token.line, token.column)

    def _fit(self, scope: str, name: str, op: str, literal: Any, where: Tree) -> Any:
        model = self.models.get(scope)
        if model is None:
            return literal
        label = f"'{name}'" if scope == RECEIVER else f"'{scope}.{name}'"
        try:
            return fit_literal(op, literal, model[name], label)
        except LiteralMismatch as mismatch:
            line, column = _position(where)
            raise PolicyTypeError(str(mismatch), line, column) from None


MAX_NAMES_LISTED = 30
_DECLARERS = {
    RECEIVER: "receivers' models declare",
    SENDER: "senders' models declare",
    EVENT: "the declared event attributes are",
}


def _known_names(scope: str, model: Mapping[str, AttributeType]) -> str:
    """What the vocabulary of ``scope`` has, for an unknown-attribute error."""
    if not model:
        return f"no {scope} attribute is declared"
    names = sorted(model)
    listed = ", ".join(names[:MAX_NAMES_LISTED])
    if len(names) > MAX_NAMES_LISTED:
        listed += f" and {len(names) - MAX_NAMES_LISTED} more"
    return f"{_DECLARERS[scope]} {listed}"


def _check_operator_fits_literal(op: str, literal: Any, where: Tree) -> None:
    """Model-free checks: patterns need text, ordering cannot use true/false."""
    line, column = _position(where)
    if op in PATTERN_OPS and not isinstance(literal, str):
        raise PolicyTypeError(f"'{op}' needs a quoted text pattern", line, column)
    if op in ORDERING_OPS and isinstance(literal, bool):
        raise PolicyTypeError(f"'{op}' cannot compare with true or false", line, column)


def _literal(token: Token) -> Any:
    if token.type == "TRUE":
        return True
    if token.type == "FALSE":
        return False
    try:
        if token.type == "NUMBER":
            return parse_number(str(token))
        return json.loads(str(token), strict=False)
    except ValueError as problem:
        reason = _literal_problem(token, problem)
        raise PolicySyntaxError(reason, token.line, token.column) from None


def _literal_problem(token: Token, problem: ValueError) -> str:
    if token.type == "NUMBER":
        return f"number {_shorten(str(token))} is too large"
    return f"invalid escape sequence in text {_shorten(str(token))}"


def _position(node: Tree | Token) -> tuple[int, int]:
    if isinstance(node, Token):
        return node.line or 1, node.column or 1
    meta = node.meta
    return getattr(meta, "line", 1), getattr(meta, "column", 1)
