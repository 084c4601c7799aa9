"""Events as the dispatchers see them: loaded once per task, selectors parsed once."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.utils import timezone

from broker.models import Event
from broker.prepared import prepared_cursor
from broker.vocabulary import STAMP_COLUMNS, Vocabulary, stored_selector, vocabulary, vocabulary_at
from policies import Selector
from policies.expressions import EVENT, SENDER

LOSS_SAMPLE = 200  # recent events a summary's coagulation loss is measured on


@dataclass(frozen=True)
class RoutedEvent:
    """The parts of an event that routing and matching need."""

    id: str
    sender_id: int
    channel: str
    sequence: int
    content: dict[str, Any]
    selector: Selector | None
    sender_attributes: dict[str, Any]
    expires_at: datetime
    # Only these receivers may get it (a resend); None: whoever matches.
    recipients: frozenset[int] | None = None
    # As stored: hops carry the text, each dispatcher types it with its vocabulary.
    selector_text: str = ""

    def may_reach(self, receiver_id: int) -> bool:
        """Whether the event may reach this receiver (it is not limited to others)."""
        return self.recipients is None or receiver_id in self.recipients

    def reachable(self, receiver_ids: set[int]) -> set[int]:
        """Those of `receiver_ids` the event may reach."""
        if self.recipients is None:
            return receiver_ids
        return {receiver_id for receiver_id in receiver_ids if receiver_id in self.recipients}

    @property
    def stream(self) -> tuple[int, str]:
        """Events of one stream reach each receiver in sequence order."""
        return (self.sender_id, self.channel)


FIELDS = (
    "id",
    "sender_id",
    "channel",
    "sequence",
    "content",
    "selector",
    "sender_attributes",
    "expires_at",
    "recipients",
)


def _routed(row: tuple, words: Vocabulary) -> RoutedEvent:
    values = dict(zip(FIELDS, row, strict=True))
    values["id"] = str(values["id"])
    values["selector_text"] = values["selector"]
    values["selector"] = stored_selector(values["selector"], words)
    if values["recipients"] is not None:
        values["recipients"] = frozenset(values["recipients"])
    return RoutedEvent(**values)


# The wire shape of an event travelling between dispatchers (broker/dispatch/transport.py):
# everything routing and delivery need, so that no dispatcher reads the event back.


def wire_of(event: RoutedEvent) -> dict[str, Any]:
    """An event as a hop carries it (JSON-able)."""
    return {
        "id": event.id,
        "sender_id": event.sender_id,
        "channel": event.channel,
        "sequence": event.sequence,
        "content": event.content,
        "selector": event.selector_text,
        "sender_attributes": event.sender_attributes,
        "expires_at": event.expires_at.isoformat(),
        "recipients": None if event.recipients is None else sorted(event.recipients),
    }


def wire_of_model(event: Event) -> dict[str, Any]:
    """A freshly published event as a hop carries it."""
    routed = RoutedEvent(
        id=str(event.pk),
        sender_id=event.sender_id,
        channel=event.channel,
        sequence=event.sequence,
        content=event.content,
        selector=None,  # travels as text
        sender_attributes=event.sender_attributes,
        expires_at=event.expires_at,
        recipients=None if event.recipients is None else frozenset(event.recipients),
        selector_text=event.selector,
    )
    return wire_of(routed)


def from_wire(wire: dict[str, Any], selector: Selector | None) -> RoutedEvent:
    """The event a hop carries, with its selector typed (`broker.vocabulary.routed_selector`)."""
    recipients = wire["recipients"]
    return RoutedEvent(
        id=wire["id"],
        sender_id=wire["sender_id"],
        channel=wire["channel"],
        sequence=wire["sequence"],
        content=wire["content"],
        selector=selector,
        sender_attributes=wire["sender_attributes"],
        expires_at=datetime.fromisoformat(wire["expires_at"]),
        recipients=None if recipients is None else frozenset(recipients),
        selector_text=wire["selector"],
    )


def live_events(ids: Iterable[str] | None = None, **filters) -> list[RoutedEvent]:
    """Unexpired events (those with `ids`, or all), oldest sequence first."""
    query = Event.objects.filter(expires_at__gt=timezone.now(), **filters)
    if ids is not None:
        query = query.filter(id__in=list(ids))
    rows = list(query.order_by("sender_id", "channel", "sequence").values_list(*FIELDS))
    if not rows:
        return []
    # Read after the events: their selectors were accepted with a vocabulary committed
    # before them, which this later statement therefore sees.
    words = vocabulary()
    return [_routed(row, words) for row in rows]


@dataclass(frozen=True)
class LiveSelectors:
    """The selectors unexpired events carry, as stored ("" for none), each with the
    streams (sender, channel) of those events, and the vocabulary that types them."""

    streams: dict[str, set[tuple[int, str]]]
    words: Vocabulary | None  # None: no selector to type

    def typed(self, text: str) -> Selector | None:
        """The selector stored as `text`, typed (None: selects everyone)."""
        return stored_selector(text, self.words)


# A leaf's pass reads them at every change; as a prepared statement, with the
# vocabulary's stamp: read with the selectors, it is at least as new as they are.
LIVE_SELECTORS = f"""
SELECT s.selector, s.sender_id, s.channel, {STAMP_COLUMNS}
FROM (SELECT DISTINCT selector, sender_id, channel FROM {Event._meta.db_table}
      WHERE expires_at > %(now)s) AS s
"""


def live_selectors() -> LiveSelectors:
    """The live events' selectors: a read of three columns, to know which events may
    concern some receivers before reading any."""
    with prepared_cursor() as cursor:
        cursor.execute(LIVE_SELECTORS, {"now": timezone.now()})
        rows = cursor.fetchall()
    streams: dict[str, set[tuple[int, str]]] = defaultdict(set)
    for text, sender_id, channel, *_ in rows:
        streams[text].add((sender_id, channel))
    words = vocabulary_at(rows[0][3:]) if rows else None
    return LiveSelectors(dict(streams), words)


# Unexpired events carrying one of the selectors, past a sequence in their stream: a
# step of the (sender, channel, sequence) index per stream.
LIVE_AFTER = """
SELECT e.* FROM unnest(%s::bigint[], %s::text[], %s::bigint[]) AS s(sender_id, channel, after)
JOIN broker_event AS e
    ON e.sender_id = s.sender_id AND e.channel = s.channel AND e.sequence > s.after
WHERE e.expires_at > %s AND e.selector = ANY(%s::text[])
ORDER BY e.sender_id, e.channel, e.sequence
"""


def live_events_after(
    after: dict[tuple[int, str], int], selectors: Iterable[str]
) -> list[RoutedEvent]:
    """Unexpired events whose selector (as stored) is one of `selectors`, in the streams
    of `after` ({(sender, channel): sequence}) and past that sequence there; in stream
    order, oldest sequence first."""
    if not after:
        return []
    streams = sorted(after)
    params = [
        [sender_id for sender_id, _ in streams],
        [channel for _, channel in streams],
        [after[stream] for stream in streams],
        timezone.now(),
        sorted(selectors),
    ]
    found = list(Event.objects.raw(LIVE_AFTER, params))
    if not found:
        return []
    words = vocabulary()  # after the events, as in `live_events`
    return [_routed(tuple(getattr(event, name) for name in FIELDS), words) for event in found]


def recent_policy_inputs(limit: int = LOSS_SAMPLE) -> list[dict[str, Any]]:
    """What receivers' policies judge of the most recent events (the sender's attested
    attributes and the content), as scopes: the sample a summary's coagulation loss is
    measured on. Latest to expire first: recent in practice, and an indexed read."""
    rows = Event.objects.order_by("-expires_at").values_list("sender_attributes", "content")
    return [{SENDER: sender, EVENT: content} for sender, content in rows[:limit]]
