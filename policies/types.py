"""Attribute types, literals and the run-time tests behind every operator.

Values at run time are plain Python/JSON values: ``str``, ``int``, ``float``,
``bool`` (and ``Version`` objects if a caller wants). A test never raises: a
value of the wrong type simply fails the constraint, so a receiver advertising
``load = "high"`` is not selected by ``load >= 0.8``.

Literal domains decide how a value is compared:

* numbers (``int``/``float``, never ``bool``) compare numerically, ``1 == 1.0``;
* text compares as Python strings;
* ``bool`` only equals ``bool``;
* versions (a string literal typed by a model as ``version``) compare dotted
  numbers component-wise, so ``"2.10" > "2.4"`` and ``"2.4" == "2.4.0"``.
"""

from __future__ import annotations

import enum
import fnmatch
import json
import math
import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, TypeAlias

_VERSION_PATTERN = re.compile(r"\d+(?:\.\d+)*")


class AttributeType(enum.StrEnum):
    """The five attribute types a model may declare."""

    STRING = "string"
    INT = "int"
    FLOAT = "float"
    BOOL = "bool"
    VERSION = "version"


@lru_cache(maxsize=65536)
def version_key(text: str) -> tuple[int, ...] | None:
    """Comparable key of a dotted version string, or None if it is not one.

    Trailing zero components are dropped so that "2.4" and "2.4.0" are equal.
    Cached because receivers repeat a handful of version strings millions of times.
    """
    if not _VERSION_PATTERN.fullmatch(text):
        return None
    parts = [int(part) for part in text.split(".")]
    while len(parts) > 1 and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


@dataclass(frozen=True, eq=False)
class Version:
    """A dotted version number such as ``2.4.1``, ordered numerically per component."""

    text: str
    key: tuple[int, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        key = version_key(self.text)
        if key is None:
            raise ValueError(f"not a version: {self.text!r}")
        object.__setattr__(self, "key", key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Version) and self.key == other.key

    def __hash__(self) -> int:
        return hash(("version", self.key))

    def __lt__(self, other: Version) -> bool:
        return self.key < other.key

    def __le__(self, other: Version) -> bool:
        return self.key <= other.key

    def __gt__(self, other: Version) -> bool:
        return self.key > other.key

    def __ge__(self, other: Version) -> bool:
        return self.key >= other.key

    def __str__(self) -> str:
        return self.text


Literal: TypeAlias = str | int | float | bool | Version
Model: TypeAlias = Mapping[str, AttributeType]

ORDERING_OPS = frozenset({"<", "<=", ">", ">="})
PATTERN_OPS = frozenset({"~", "startswith", "endswith", "contains"})
COMPARISON_OPS = frozenset({"==", "!="}) | ORDERING_OPS
EXISTENCE_OPS = frozenset({"exists", "not exists"})

_PYTHON_TYPES: dict[object, AttributeType] = {
    str: AttributeType.STRING,
    int: AttributeType.INT,
    float: AttributeType.FLOAT,
    bool: AttributeType.BOOL,
    Version: AttributeType.VERSION,
}


def normalize_model(model: Mapping[str, Any] | None) -> dict[str, AttributeType] | None:
    """Turn ``{name: "float" | float | AttributeType}`` into ``{name: AttributeType}``."""
    if model is None:
        return None
    return {name: _attribute_type(name, declared) for name, declared in model.items()}


def _attribute_type(name: str, declared: Any) -> AttributeType:
    if isinstance(declared, AttributeType):
        return declared
    if declared in _PYTHON_TYPES:
        return _PYTHON_TYPES[declared]
    try:
        return AttributeType(str(declared))
    except ValueError:
        known = ", ".join(member.value for member in AttributeType)
        raise ValueError(f"attribute {name!r} has unknown type {declared!r}; use {known}") from None


# ---------------------------------------------------------------------------
# Domains: how a literal and a run-time value are brought to comparable form.

NUMBER, TEXT, BOOL, VERSION = "number", "text", "bool", "version"
_NO = object()  # "this value is not in the literal's domain"


def literal_domain(literal: Literal) -> str:
    """The comparison domain a literal imposes on run-time values."""
    if isinstance(literal, bool):
        return BOOL
    if isinstance(literal, int | float):
        return NUMBER
    if isinstance(literal, Version):
        return VERSION
    return TEXT


def runtime_kind(domain: str) -> str:
    """The Python kind a run-time value must have to be in ``domain``.

    Versions are strings at run time, which is why two constraints in the
    text and version domains can both hold on one value.
    """
    return TEXT if domain == VERSION else domain


def comparable(literal: Literal) -> Any:
    """The literal in the form values of its domain are compared with."""
    return literal.key if isinstance(literal, Version) else literal


def _as_number(value: object) -> Any:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return value
    return _NO


def _as_text(value: object) -> Any:
    if isinstance(value, str):
        return value
    return value.text if isinstance(value, Version) else _NO


def _as_bool(value: object) -> Any:
    return value if isinstance(value, bool) else _NO


def _as_version(value: object) -> Any:
    if isinstance(value, str):
        key = version_key(value)
        return _NO if key is None else key
    return value.key if isinstance(value, Version) else _NO


EXTRACTORS: dict[str, Callable[[object], Any]] = {
    NUMBER: _as_number,
    TEXT: _as_text,
    BOOL: _as_bool,
    VERSION: _as_version,
}


def to_domain(value: object, domain: str) -> Any:
    """``value`` in comparable form for ``domain``, or the ``NO_VALUE`` marker."""
    return EXTRACTORS[domain](value)


NO_VALUE = _NO

# ---------------------------------------------------------------------------
# Compiled tests: one closure per constraint, built once at parse time.

ValueTest: TypeAlias = Callable[[object], bool]

_COMPARATORS: dict[str, Callable[[Any, Any], bool]] = {
    "==": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


def compile_test(op: str, literal: Any) -> ValueTest:
    """A predicate on a *present* run-time value for ``<attribute> op literal``."""
    if op == "in":
        return _membership_test(literal)
    if op in PATTERN_OPS:
        return _pattern_test(op, literal)
    return _comparison_test(op, literal)


def _comparison_test(op: str, literal: Literal) -> ValueTest:
    extract = EXTRACTORS[literal_domain(literal)]
    compare = _COMPARATORS[op]
    expected = comparable(literal)

    def test(value: object) -> bool:
        converted = extract(value)
        return converted is not _NO and compare(converted, expected)

    return test


def _membership_test(literals: tuple[Literal, ...]) -> ValueTest:
    # One set per domain, so a value is converted at most once per domain.
    by_domain: dict[str, set[Any]] = {}
    for literal in literals:
        by_domain.setdefault(literal_domain(literal), set()).add(comparable(literal))
    pairs = [(EXTRACTORS[domain], members) for domain, members in by_domain.items()]

    def test(value: object) -> bool:
        for extract, members in pairs:
            converted = extract(value)
            if converted is not _NO and converted in members:
                return True
        return False

    return test


def _pattern_test(op: str, pattern: str) -> ValueTest:
    if op == "~":
        matches = glob_regex(pattern).match

        def text_test(text: str) -> bool:
            return matches(text) is not None

    else:
        text_test = _STRING_METHODS[op](pattern)

    def test(value: object) -> bool:
        text = _as_text(value)
        return text is not _NO and text_test(text)

    return test


_STRING_METHODS: dict[str, Callable[[str], Callable[[str], bool]]] = {
    "startswith": lambda pattern: lambda text: text.startswith(pattern),
    "endswith": lambda pattern: lambda text: text.endswith(pattern),
    "contains": lambda pattern: lambda text: pattern in text,
}


@lru_cache(maxsize=4096)
def glob_regex(pattern: str) -> re.Pattern[str]:
    """Compiled, case-sensitive fnmatch-style pattern (``*``, ``?``, ``[...]``)."""
    return re.compile(fnmatch.translate(pattern))


GLOB_METACHARACTERS = frozenset("*?[")


def glob_literal_prefix(pattern: str) -> str:
    """The part of a glob before its first wildcard: every match starts with it."""
    for index, char in enumerate(pattern):
        if char in GLOB_METACHARACTERS:
            return pattern[:index]
    return pattern


# ---------------------------------------------------------------------------
# Literal text, and fitting literals to declared attribute types.


def format_literal(literal: Literal) -> str:
    """Literal as it is written in the language (parses back to an equal literal)."""
    if isinstance(literal, bool):
        return "true" if literal else "false"
    if isinstance(literal, Version):
        return json.dumps(literal.text, ensure_ascii=False)
    if isinstance(literal, str):
        return json.dumps(literal, ensure_ascii=False)
    if isinstance(literal, float):
        return repr(literal)
    return str(literal)


class LiteralMismatch(Exception):
    """Raised by ``fit_literal``; the parser adds the position."""


class ValueMismatch(Exception):
    """Raised by ``check_value``; the message completes "<attribute> ...", the caller
    names the attribute and the field."""


MAX_TEXT_LENGTH = 1000  # any text value: an attribute value or a content value


@dataclass(frozen=True)
class TypeDefinition:
    """Everything the service knows about one attribute type, in one place.

    ``words`` say what a value of the type is, in an operator's words, for errors;
    ``value`` turns a run-time (JSON) value into its stored form, or ``NO_VALUE`` if
    it does not fit; ``literal`` turns that stored form into the literal the
    language compares with (a version's text becomes a ``Version``). ``ordered``:
    ``<``, ``<=``, ``>``, ``>=`` apply; ``textual``: ``~`` and the string operators
    apply. Literals and values fit by the same rule, so whatever a policy can
    compare with is what a client can state.
    """

    type: AttributeType
    words: str
    value: Callable[[object], Any]
    literal: Callable[[Any], Literal] = lambda stored: stored
    ordered: bool = True
    textual: bool = False


def _text_value(value: object) -> Any:
    return value if isinstance(value, str) else _NO


def _whole_number_value(value: object) -> Any:
    return value if isinstance(value, int) and not isinstance(value, bool) else _NO


def _number_value(value: object) -> Any:
    number = _as_number(value)
    return _NO if number is _NO or not math.isfinite(number) else float(number)


def _version_value(value: object) -> Any:
    return value if isinstance(value, str) and version_key(value) is not None else _NO


TYPE_DEFINITIONS: dict[AttributeType, TypeDefinition] = {
    definition.type: definition
    for definition in (
        TypeDefinition(AttributeType.STRING, "quoted text", _text_value, textual=True),
        TypeDefinition(AttributeType.INT, "a whole number", _whole_number_value),
        TypeDefinition(AttributeType.FLOAT, "a number", _number_value),
        TypeDefinition(AttributeType.BOOL, "true or false", _as_bool, ordered=False),
        TypeDefinition(
            AttributeType.VERSION,
            'a dotted version such as "2.4.1"',
            _version_value,
            literal=Version,
            textual=True,
        ),
    )
}

# For a model's type field: ("float", "float: a number").
ATTRIBUTE_TYPE_CHOICES = [
    (d.type.value, f"{d.type.value}: {d.words}") for d in TYPE_DEFINITIONS.values()
]


def check_value(declared: AttributeType, value: object) -> Any:
    """``value`` in its stored form if it fits ``declared``, else raise ValueMismatch."""
    if isinstance(value, str) and len(value) > MAX_TEXT_LENGTH:
        raise ValueMismatch(f"is longer than {MAX_TEXT_LENGTH} characters")
    definition = TYPE_DEFINITIONS[AttributeType(declared)]
    stored = definition.value(value)
    if stored is _NO:
        raise ValueMismatch(f"must be {definition.words}, got {_shown(value)}")
    return stored


def _shown(value: object) -> str:
    shown = json.dumps(value, ensure_ascii=False) if _is_json(value) else repr(value)
    return shown if len(shown) <= 40 else shown[:37] + "..."


def _is_json(value: object) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


def fit_literal(op: str, literal: Literal, declared: AttributeType, label: str) -> Literal:
    """Check ``literal`` against the declared type of attribute ``label``; return it typed.

    Ints become floats for float attributes and strings become ``Version`` for
    version attributes (except glob/substring patterns, which stay text).
    """
    definition = TYPE_DEFINITIONS[declared]
    if op in PATTERN_OPS:
        if not definition.textual:
            raise LiteralMismatch(f"'{op}' applies to text, but {label} is {_a(declared)}")
        return literal
    if op in ORDERING_OPS and not definition.ordered:
        raise LiteralMismatch(f"'{op}' does not apply to {label}, which is {definition.words}")
    stored = definition.value(literal)
    if stored is _NO:
        found = format_literal(literal)
        raise LiteralMismatch(
            f"expected {definition.words} for {label} ({declared}), found {found}"
            + _unquoting_hint(literal, definition)
        )
    return definition.literal(stored)


def _unquoting_hint(literal: Literal, definition: TypeDefinition) -> str:
    """`trust >= "2"`: the operator meant the number; say how to write it."""
    if not isinstance(literal, str) or definition.type not in (
        AttributeType.INT,
        AttributeType.FLOAT,
    ):
        return ""
    text = literal.strip()
    if not _NUMBER_TEXT.fullmatch(text):
        return ""
    try:
        number = parse_number(text)
    except ValueError:
        return ""
    return "" if definition.value(number) is _NO else f": write {text} without quotes"


_NUMBER_TEXT = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")  # as the grammar


def _a(declared: AttributeType) -> str:
    return f"an {declared}" if declared[0] in "aeiou" else f"a {declared}"


def check_truth_shorthand(declared: AttributeType, written: str) -> None:
    """A bare attribute as a condition means ``== true``: only for a bool attribute."""
    if declared is not AttributeType.BOOL:
        words = TYPE_DEFINITIONS[declared].words
        raise LiteralMismatch(
            f"'{written}' alone means '{written} == true', which needs true or false, but "
            f"'{written}' is {_a(declared)} ({words}): compare it with a value"
        )


def parse_number(text: str) -> int | float:
    """Number token to int or float; raises ValueError if it is out of range."""
    if any(char in text for char in ".eE"):
        number = float(text)
        if not math.isfinite(number):
            raise ValueError("number out of range")
        return number
    return int(text)
