"""Writing attribute values (after they were checked), shared by the client and the
authority services."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.utils import timezone

from broker.models import AttributeValue, Client

UPDATED_ON_CONFLICT = [
    "value",
    "source",
    "authority",
    "set_at",
    "expires_at",
    "revoked_at",
    "revoked_by",
]


def write_values(
    client: Client,
    values: Mapping[str, Any],
    *,
    source: str,
    authority=None,
    expires_at=None,
) -> None:
    """Set the client's values, with their provenance, in one statement (an upsert on
    the one value per client and attribute)."""
    now = timezone.now()
    AttributeValue.objects.bulk_create(
        [
            AttributeValue(
                client=client,
                name=name,
                value=value,
                source=source,
                authority=authority,
                set_at=now,
                expires_at=expires_at,
                revoked_at=None,
                revoked_by="",
            )
            for name, value in values.items()
        ],
        update_conflicts=True,
        unique_fields=["client", "name"],
        update_fields=UPDATED_ON_CONFLICT,
    )


def printable(values: Any) -> Any:
    """Values as they can be stored in an audit entry's JSON."""
    if isinstance(values, Mapping):
        return {
            str(k): v if isinstance(v, str | int | float | bool) else repr(v)
            for k, v in values.items()
        }
    return repr(values)
