"""The policy language, as an agent checks it for itself (docs/policy-language.md).

Before it acts on a verified event, an agent that verifies asks again what the console
asked: does the event's selector select this server, and does this server's own policy
accept the sender's attested attributes and the content? So a genuine event delivered
where its sender did not address it, or to a receiver whose policy refuses it, is not
acted on, whatever the console's database says.

The console's `policies` package is the language's reference (Python 3.11, compiled
dependencies); this is a small evaluator for Python 3.9 with no dependency. It follows
the language read without a vocabulary: a literal's kind (text, number, true/false)
decides how a value is compared, as in `policies` when no model types the names. A test
runs both over the same expressions and values (tests/agent/test_expressions.py), so
the two cannot drift apart. What differs: an attribute the vocabulary declares as a
version is compared as text here (`"2.10" < "2.9"`), so an ordered comparison of
versions may be refused here though the console accepted it: the agent then refuses.
"""

from __future__ import annotations

import fnmatch
import json
import re
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

Scopes = Mapping[str, Mapping[str, Any]]
# True, False, or None: it depends on attributes the evaluator does not know.
Truth = Optional[bool]
Test = Callable[[Scopes], Truth]


class Partly(dict):
    """A scope's values, of which these are all this evaluator knows: a name missing
    from it is unknown, not absent (an agent knows what it states of itself, not what
    authorities attest of it)."""


TOKEN = re.compile(
    r"""(?P<space>\s+|\#[^\n]*)
      | (?P<string>"(?:[^"\\]|\\.)*")
      | (?P<number>[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)
      | (?P<op>==|!=|<=|>=|<|>|~|\(|\)|\[|\]|,)
      | (?P<name>[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)""",
    re.VERBOSE,
)
KEYWORDS = frozenset(
    [
        "accept",
        "or",
        "and",
        "not",
        "in",
        "exists",
        "true",
        "false",
        "startswith",
        "endswith",
        "contains",
    ]
)
COMPARISONS = ("==", "!=", "<=", ">=", "<", ">", "~", "startswith", "endswith", "contains")
POLICY_SCOPES = ("sender", "event")
SELECTOR_SCOPE = "receiver"
MAX_DEPTH = 100


class ExpressionError(ValueError):
    """A text that is not a policy or selector of the language, with where."""


def policy_test(text: str) -> Test:
    """The test of `accept ...` on {"sender": ..., "event": ...}."""
    parser = _Parser(text, scopes=POLICY_SCOPES)
    parser.expect("accept")
    return parser.whole()


def selector_test(text: str) -> Test:
    """The test of a selector on {"receiver": ...}; an empty one selects everyone."""
    if not text.strip():
        return lambda scopes: True
    return _Parser(text, scopes=(SELECTOR_SCOPE,)).whole()


def _tokens(text: str) -> List[Tuple[str, str, int]]:
    found, at = [], 0
    while at < len(text):
        match = TOKEN.match(text, at)
        if match is None:
            raise ExpressionError(f"unexpected {text[at]!r} at character {at + 1}")
        kind = match.lastgroup
        word = match.group()
        if kind == "name" and word in KEYWORDS:
            kind = "keyword"
        if kind != "space":
            found.append((kind, word, at))
        at = match.end()
    return found


class _Parser:
    """Recursive descent over the grammar of `policies/grammar.lark`."""

    def __init__(self, text: str, *, scopes: Tuple[str, ...]) -> None:
        self.tokens = _tokens(text)
        self.at = 0
        self.scopes = scopes

    def whole(self) -> Test:
        test = self.expression(0)
        if self.at < len(self.tokens):
            self.fail("expected and, or or the end")
        return test

    # Tokens ------------------------------------------------------------------------

    def peek(self) -> Optional[str]:
        return self.tokens[self.at][1] if self.at < len(self.tokens) else None

    def take(self) -> Tuple[str, str, int]:
        if self.at >= len(self.tokens):
            raise ExpressionError("the text ends too early")
        self.at += 1
        return self.tokens[self.at - 1]

    def accept(self, word: str) -> bool:
        if self.peek() == word and self.tokens[self.at][0] in ("keyword", "op"):
            self.at += 1
            return True
        return False

    def expect(self, word: str) -> None:
        if not self.accept(word):
            self.fail(f"expected {word}")

    def fail(self, message: str):
        where = self.tokens[self.at][2] + 1 if self.at < len(self.tokens) else "the end"
        raise ExpressionError(f"{message} at character {where}")

    # Grammar -----------------------------------------------------------------------

    def expression(self, depth: int) -> Test:
        if depth > MAX_DEPTH:
            self.fail("nested too deeply")
        tests = [self.conjunction(depth)]
        while self.accept("or"):
            tests.append(self.conjunction(depth))
        return tests[0] if len(tests) == 1 else _any(tests)

    def conjunction(self, depth: int) -> Test:
        tests = [self.negation(depth)]
        while self.accept("and"):
            tests.append(self.negation(depth))
        return tests[0] if len(tests) == 1 else _all(tests)

    def negation(self, depth: int) -> Test:
        if self.accept("not"):
            inner = self.negation(depth + 1)
            return lambda scopes: _not(inner(scopes))
        return self.atom(depth)

    def atom(self, depth: int) -> Test:
        if self.accept("("):
            inner = self.expression(depth + 1)
            self.expect(")")
            return inner
        if self.accept("true"):
            return lambda scopes: True
        if self.accept("false"):
            return lambda scopes: False
        kind, word, _ = self.take()
        if kind != "name":
            self.at -= 1
            self.fail("expected an attribute, true, false or (")
        return self.condition(self.attribute(word))

    def attribute(self, word: str) -> Tuple[str, str]:
        scope, _, name = word.rpartition(".")
        if not scope and self.scopes == (SELECTOR_SCOPE,):
            scope = SELECTOR_SCOPE
        if scope not in self.scopes or "." in name:
            self.at -= 1
            self.fail(f"{word} is not a name of {' or '.join(s + '.x' for s in self.scopes)}")
        return scope, name

    def condition(self, attribute: Tuple[str, str]) -> Test:
        word = self.peek()
        if word in COMPARISONS and self.accept(word):
            return _compared(attribute, word, self.value())
        if self.accept("in"):
            return _member(attribute, self.values())
        if self.accept("exists"):
            return _present(attribute, True)
        if self.peek() == "not" and self._next_is("exists"):
            self.at += 2
            return _present(attribute, False)
        return _compared(attribute, "==", True)  # `cgi` is `cgi == true`

    def _next_is(self, word: str) -> bool:
        return self.at + 1 < len(self.tokens) and self.tokens[self.at + 1][1] == word

    def values(self) -> List[Any]:
        self.expect("[")
        found: List[Any] = []
        if self.accept("]"):
            return found
        found.append(self.value())
        while self.accept(","):
            found.append(self.value())
        self.expect("]")
        return found

    def value(self) -> Any:
        kind, word, _ = self.take()
        if kind == "keyword" and word in ("true", "false"):
            return word == "true"
        if kind == "string":
            return json.loads(word)
        if kind == "number":
            return float(word) if any(c in word for c in ".eE") else int(word)
        self.at -= 1
        self.fail("expected a value: text, a number, true or false")


# Conditions ---------------------------------------------------------------------------


def _kind(value: Any) -> Optional[str]:
    """The kind a literal compares values in (a value of another kind never matches)."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    return "text" if isinstance(value, str) else None


OPERATORS: Dict[str, Callable[[Any, Any], bool]] = {
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
    "startswith": lambda a, b: a.startswith(b),
    "endswith": lambda a, b: a.endswith(b),
    "contains": lambda a, b: b in a,
}


UNKNOWN = object()
PATTERNS = ("~", "startswith", "endswith", "contains")
ORDERINGS = ("<", "<=", ">", ">=")


def _value_of(scopes: Scopes, attribute: Tuple[str, str]) -> Any:
    values = scopes.get(attribute[0])
    if values is None:  # not `or {}`: an empty Partly still knows nothing, not "none"
        values = {}
    if isinstance(values, Partly) and attribute[1] not in values:
        return UNKNOWN
    return values.get(attribute[1])


def _compared(attribute: Tuple[str, str], op: str, literal: Any) -> Test:
    if op in PATTERNS and not isinstance(literal, str):
        raise ExpressionError(f"{op} takes quoted text")
    if op in ORDERINGS and isinstance(literal, bool):
        raise ExpressionError(f"{op} does not compare true or false")
    kind = "text" if op in PATTERNS else _kind(literal)
    compare = _glob(literal) if op == "~" else OPERATORS[op]

    def test(scopes: Scopes) -> Truth:
        value = _value_of(scopes, attribute)
        if value is UNKNOWN:
            return None
        return value is not None and _kind(value) == kind and compare(value, literal)

    return test


def _glob(pattern: str) -> Callable[[Any, Any], bool]:
    matches = re.compile(fnmatch.translate(pattern)).match
    return lambda value, _: matches(value) is not None


def _member(attribute: Tuple[str, str], literals: List[Any]) -> Test:
    keyed = [(_kind(literal), literal) for literal in literals]

    def test(scopes: Scopes) -> Truth:
        value = _value_of(scopes, attribute)
        if value is UNKNOWN:
            return None
        return value is not None and (_kind(value), value) in keyed

    return test


def _present(attribute: Tuple[str, str], wanted: bool) -> Test:
    def test(scopes: Scopes) -> Truth:
        value = _value_of(scopes, attribute)
        return None if value is UNKNOWN else (value is not None) == wanted

    return test


# Three-valued logic: None (unknown) is true or false, whichever the unknown values make it.


def _not(truth: Truth) -> Truth:
    return None if truth is None else not truth


def _any(tests: List[Test]) -> Test:
    def test(scopes: Scopes) -> Truth:
        truths = [each(scopes) for each in tests]
        return True if True in truths else (None if None in truths else False)

    return test


def _all(tests: List[Test]) -> Test:
    def test(scopes: Scopes) -> Truth:
        truths = [each(scopes) for each in tests]
        return False if False in truths else (None if None in truths else True)

    return test
