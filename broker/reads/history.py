"""A client as it was at a past moment: the attribute history a trigger keeps, and
the policy then in force."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Min

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


@dataclass(frozen=True)
class Lapse:
    """A value a client no longer held at some moment: it expired or was revoked. An
    attested value replaces the one before it, and when it lapses the earlier value
    does not come back (the authority said the new one; it never re-said the old):
    `replaced` is that earlier value, for the page to say so."""

    held: Provenance
    how: str  # "expired" or "revoked"
    at: datetime
    revoked_by: str
    replaced: Provenance | None


def lapsed_as_of(client: Client, moment: datetime, names: set[str]) -> dict[str, Lapse]:
    """{name: Lapse} of those `names` the client had held before `moment` but no longer
    held then, because the value expired or was revoked."""
    newest = (
        AttributeHistory.objects.filter(client=client, at__lte=moment, name__in=names)
        .order_by("name", "-at", "-id")
        .distinct("name")
        .select_related("authority")
    )
    return {row.name: lapse for row in newest if (lapse := _lapse(client, row, moment))}


def _lapse(client: Client, row: AttributeHistory, moment: datetime) -> Lapse | None:
    if row.kind == AttributeHistory.Kind.REVOKED:
        how, at = "revoked", row.happened_at
    elif row.expires_at is not None and row.expires_at <= moment:
        how, at = "expired", row.expires_at
    else:
        return None  # still held
    earlier = attributes_as_of(client, row.set_at - timedelta(microseconds=1)).get(row.name)
    return Lapse(_provenance(row), how, at, row.revoked_by, earlier)


def _provenance(row: AttributeHistory) -> Provenance:
    authority = row.authority.name if row.authority_id else None
    return Provenance(row.value, row.source, authority, row.set_at, row.expires_at)


def history_kept_from() -> datetime | None:
    """The first moment the attribute history still holds every value standing at:
    retention carried them to it when it dropped the days before (None: nothing was
    dropped). Reads "as of" an earlier moment miss what those days held."""
    carried = AttributeHistory.objects.filter(carried_from__isnull=False)
    return carried.aggregate(first=Min("at"))["first"]


def policy_as_of(client: Client, moment: datetime) -> PolicyVersion | None:
    """The client's policy in force at `moment`: its newest version saved at or
    before it (None: it had none, and so accepted nothing)."""
    versions = client.policy_versions.filter(created_at__lte=moment)
    return versions.order_by("-version").first()


def policy_history(client: Client) -> list[PolicyVersion]:
    """The client's policy versions, newest first."""
    return list(client.policy_versions.order_by("-version"))
