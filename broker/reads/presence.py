"""Agents' presence (broker.services.presence writes it): who counts as connected,
and the facets of "last seen"."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Q
from sn_agent.client import ACTS_ON_ANYTHING, ACTS_ON_NOTHING, ACTS_ON_SIGNED

from broker.errors import InvalidInput
from broker.models import (
    AgentPresence,
    Client,
)

# Agents' presence (broker.services.presence writes it).

# Sessions a killed web process left open are never closed; a session that is really
# open is seen at least every PRESENCE_REFRESH_S (and a heartbeat), so rows not seen
# for this many refreshes do not count as connected.
CONNECTED_WITHIN_REFRESHES = 3


def presence_window() -> timedelta:
    """How recently a client must have been seen to count as connected."""
    return CONNECTED_WITHIN_REFRESHES * timedelta(seconds=settings.PRESENCE_REFRESH_S)


def is_connected(presence: AgentPresence | None, now: datetime) -> bool:
    """The one rule for "connected": an open session, seen within the window."""
    return (
        presence is not None
        and presence.sessions > 0
        and presence.last_seen_at > now - presence_window()
    )


def connected_q(now: datetime, *, via: str = "") -> Q:
    """`is_connected` as a filter: on AgentPresence, or through a relation (`via`
    "presence__" on Client; a client without a row is not connected)."""
    return Q(**{f"{via}sessions__gt": 0, f"{via}last_seen_at__gt": now - presence_window()})


def presence_of(client: Client) -> AgentPresence | None:
    """The client's presence row, None if its agent never logged in."""
    return AgentPresence.objects.filter(client=client).first()


def presence_changed_since(moment: datetime) -> list[AgentPresence]:
    """Rows written at or after `moment`, oldest first. A write's time is its
    transaction's start, so an incremental reader should ask again from a little
    before the newest time it saw (rows read twice are harmless)."""
    return list(AgentPresence.objects.filter(updated_at__gte=moment).order_by("updated_at"))


# The facets of "last seen", in order: each holds ages up to its limit (and above the
# previous one); then older, then no row at all.
LAST_SEEN_WITHIN = {
    "within 1 minute": timedelta(minutes=1),
    "within 1 hour": timedelta(hours=1),
    "within 1 day": timedelta(days=1),
}


LAST_SEEN_OLDER = "over 1 day"


LAST_SEEN_NEVER = "never"


LAST_SEEN_BUCKETS = (*LAST_SEEN_WITHIN, LAST_SEEN_OLDER, LAST_SEEN_NEVER)

# Whether an agent verifies the signatures of what it acts on, as the fleet page and a
# client's page say it, from what the agent said at its last login (AgentPresence.acts_on).
VERIFIES_SIGNATURES = {
    ACTS_ON_SIGNED: "yes",
    ACTS_ON_ANYTHING: "no: acts on anything",
    ACTS_ON_NOTHING: "no: runs no action",
    "": "unknown",
}
SIGNATURE_CHECKING = tuple(VERIFIES_SIGNATURES.values())


def verifies_signatures(acts_on: str) -> str:
    """What the console says of an agent that acts on `acts_on` ("" unknown: it never
    logged in, or its release does not say)."""
    return VERIFIES_SIGNATURES.get(acts_on, VERIFIES_SIGNATURES[""])


def last_seen_bucket(last_seen_at: datetime | None, now: datetime) -> str:
    """The label of the bucket `last_seen_at` falls in (None: never seen)."""
    if last_seen_at is None:
        return LAST_SEEN_NEVER
    age = now - last_seen_at
    return next((b for b, limit in LAST_SEEN_WITHIN.items() if age <= limit), LAST_SEEN_OLDER)


def last_seen_q(bucket: str, now: datetime, *, via: str = "") -> Q:
    """`last_seen_bucket(...) == bucket` as a filter, for counting facets in SQL
    (`via` as for `connected_q`)."""
    field = f"{via}last_seen_at"
    if bucket == LAST_SEEN_NEVER:
        return Q(**{f"{field}__isnull": True})
    older_than = Q()  # not in the previous bucket
    for label, limit in LAST_SEEN_WITHIN.items():
        if label == bucket:
            return Q(**{f"{field}__gte": now - limit}) & older_than
        older_than = Q(**{f"{field}__lt": now - limit})
    if bucket == LAST_SEEN_OLDER:
        return older_than
    raise InvalidInput(
        f"last seen must be one of: {', '.join(LAST_SEEN_BUCKETS)}", field="last_seen"
    )


def connected_count(now: datetime) -> int:
    """How many clients count as connected (`is_connected`) at `now`."""
    return AgentPresence.objects.filter(connected_q(now)).count()
