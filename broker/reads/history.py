"""A client as it was at a past moment: the attribute history a trigger keeps, and
the policy then in force."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from broker.models import (
    AttributeHistory,
    AttributeValue,
    Client,
    PolicyVersion,
)


@dataclass(frozen=True)
class Provenance:
    """A value a client held at some moment, and who set it when, until when."""

    value: Any
    source: str  # AttributeValue.Source
    authority: str | None  # the attesting authority's name
    set_at: datetime
    expires_at: datetime | None

    @property
    def attested(self) -> bool:
        return self.source == AttributeValue.Source.AUTHORITY


def attributes_as_of(client: Client, moment: datetime) -> dict[str, Provenance]:
    """{name: provenance} of the values the client held at `moment`: for each name the
    last change at or before it, unless that was a revocation or the value had
    expired by then. One query (the history's index serves it)."""
    newest = (
        AttributeHistory.objects.filter(client=client, at__lte=moment)
        .order_by("name", "-at", "-id")
        .distinct("name")
        .select_related("authority")
    )
    return {
        row.name: _provenance(row)
        for row in newest
        if row.kind != AttributeHistory.Kind.REVOKED
        and (row.expires_at is None or row.expires_at > moment)
    }


def _provenance(row: AttributeHistory) -> Provenance:
    authority = row.authority.name if row.authority_id else None
    return Provenance(row.value, row.source, authority, row.set_at, row.expires_at)


def policy_as_of(client: Client, moment: datetime) -> PolicyVersion | None:
    """The client's policy in force at `moment`: its newest version saved at or
    before it (None: it had none, and so accepted nothing)."""
    versions = client.policy_versions.filter(created_at__lte=moment)
    return versions.order_by("-version").first()


def policy_history(client: Client) -> list[PolicyVersion]:
    """The client's policy versions, newest first."""
    return list(client.policy_versions.order_by("-version"))
