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


_EXPECTED_WORDS = {
    AttributeType.STRING: "a quoted text",
    AttributeType.INT: "a whole number",
    AttributeType.FLOAT: "a number",
    AttributeType.BOOL: "true or false",
    AttributeType.VERSION: 'a version such as "2.4"',
}


def fit_literal(op: str, literal: Literal, declared: AttributeType, label: str) -> Literal:
    """Check ``literal`` against the declared type of attribute ``label``; return it typed.

    Ints become floats for float attributes and strings become ``Version`` for
    version attributes (except glob/substring patterns, which stay text).
    """
    if op in PATTERN_OPS:
        return _fit_pattern(op, literal, declared, label)
    if declared is AttributeType.BOOL and op in ORDERING_OPS:
        raise LiteralMismatch(f"'{op}' does not apply to {label}, which is true or false")
    fitted = _FITTERS[declared](literal)
    if fitted is _NO:
        expected = _EXPECTED_WORDS[declared]
        found = format_literal(literal)
        raise LiteralMismatch(f"expected {expected} for {label} ({declared}), found {found}")
    return fitted


def _fit_pattern(op: str, literal: Literal, declared: AttributeType, label: str) -> Literal:
    if declared not in (AttributeType.STRING, AttributeType.VERSION):
        raise LiteralMismatch(f"'{op}' applies to text, but {label} is a {declared}")
    return literal


def _fit_int(literal: Literal) -> Any:
    return literal if _as_number(literal) is not _NO and isinstance(literal, int) else _NO


def _fit_float(literal: Literal) -> Any:
    return float(literal) if _as_number(literal) is not _NO else _NO


def _fit_version(literal: Literal) -> Any:
    if isinstance(literal, str) and version_key(literal) is not None:
        return Version(literal)
    return _NO


def _fit_string(literal: Literal) -> Any:
    return literal if isinstance(literal, str) else _NO


_FITTERS: dict[AttributeType, Callable[[Literal], Any]] = {
    AttributeType.STRING: _fit_string,
    AttributeType.INT: _fit_int,
    AttributeType.FLOAT: _fit_float,
    AttributeType.BOOL: lambda literal: literal if isinstance(literal, bool) else _NO,
    AttributeType.VERSION: _fit_version,
}


def parse_number(text: str) -> int | float:
    """Number token to int or float; raises ValueError if it is out of range."""
    if any(char in text for char in ".eE"):
        number = float(text)
        if not math.isfinite(number):
            raise ValueError("number out of range")
        return number
    return int(text)
