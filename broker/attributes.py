"""Checking attribute values against a client's model, before anything is written."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from broker.errors import InvalidInput
from policies import AttributeType
from policies.types import version_key

MAX_STRING_LENGTH = 1000


def check_value(name: str, type_name: str, value: Any) -> Any:
    """Return `value` in its stored form if it fits `type_name`, else raise InvalidInput."""
    checker = _CHECKERS[AttributeType(type_name)]
    checked = checker(value)
    if checked is _MISFIT:
        raise InvalidInput(
            f"{name} must be {_DESCRIPTIONS[AttributeType(type_name)]}, got {value!r}",
            field=name,
        )
    return checked


def check_values(declared: Mapping[str, str], values: Mapping[str, Any]) -> dict[str, Any]:
    """Check every value against the declared types; unknown names are refused."""
    if not isinstance(values, Mapping) or not values:
        raise InvalidInput("give at least one attribute value", field="attributes")
    checked = {}
    for name, value in values.items():
        if name not in declared:
            known = ", ".join(sorted(declared)) or "none"
            raise InvalidInput(
                f"{name} is not an attribute of this model (it has: {known})", field=name
            )
        checked[name] = check_value(name, declared[name], value)
    return checked


_MISFIT = object()


def _string(value: Any) -> Any:
    return value if isinstance(value, str) and len(value) <= MAX_STRING_LENGTH else _MISFIT


def _int(value: Any) -> Any:
    return value if isinstance(value, int) and not isinstance(value, bool) else _MISFIT


def _float(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return _MISFIT
    return float(value)


def _bool(value: Any) -> Any:
    return value if isinstance(value, bool) else _MISFIT


def _version(value: Any) -> Any:
    return value if isinstance(value, str) and version_key(value) is not None else _MISFIT


_CHECKERS = {
    AttributeType.STRING: _string,
    AttributeType.INT: _int,
    AttributeType.FLOAT: _float,
    AttributeType.BOOL: _bool,
    AttributeType.VERSION: _version,
}
_DESCRIPTIONS = {
    AttributeType.STRING: f"text (at most {MAX_STRING_LENGTH} characters)",
    AttributeType.INT: "a whole number",
    AttributeType.FLOAT: "a number",
    AttributeType.BOOL: "true or false",
    AttributeType.VERSION: 'a dotted version such as "2.4.1"',
}
