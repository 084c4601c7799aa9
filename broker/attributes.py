"""Checking attribute values against a client's model, before anything is written.

What fits a type is defined once, in `policies.types.TYPE_DEFINITIONS`; this module
only names the offending attribute as the field."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from broker.errors import InvalidInput
from policies import AttributeType
from policies.types import ValueMismatch
from policies.types import check_value as fit_value


def check_value(name: str, type_name: str, value: Any, *, field: str | None = None) -> Any:
    """Return `value` in its stored form if it fits `type_name`, else raise InvalidInput
    naming `field` (the attribute's name unless given)."""
    try:
        return fit_value(AttributeType(type_name), value)
    except ValueMismatch as mismatch:
        raise InvalidInput(f"{name} {mismatch}", field=field or name) from None


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
