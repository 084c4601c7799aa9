"""Reads of deliveries: a receiver's stream, its position in it and what it may be
sent again."""

from __future__ import annotations

from collections.abc import Iterable

from django.db.models import Count, QuerySet
from django.utils import timezone

from broker.models import (
    Client,
    Delivery,
    Event,
    ReceiverStream,
)
from broker.prepared import int_array, prepared_cursor
from broker.push.to_agents import Pushed


def deliveries_to_replay(
    client: Client,
    *,
    after_position: int,
    through: int,
    unanswered_only: bool,
    limit: int,
) -> list[dict]:
    """The client's deliveries of unexpired events at positions after `after_position`
    up to `through`, in position order (its leaf commits them in that order, so channel
    order holds in every stream); only those it has not answered if `unanswered_only`."""
    query = Delivery.objects.filter(
        receiver=client,
        position__gt=after_position,
        position__lte=through,
        expires_at__gt=timezone.now(),  # the event's: the live partitions only
    )
    if unanswered_only:
        query = query.filter(state__in=UNANSWERED)
    rows = query.order_by("position").values(*REPLAY_FIELDS)[:limit]
    return [_notification(client, row) for row in rows]


UNANSWERED = (Delivery.State.PENDING, Delivery.State.DELIVERED)


REPLAY_FIELDS = ("pk", "position", "event_id", "sender_id", "channel", "sequence")
REPLAY_FIELDS += ("event__content", "event__seal")


def _notification(client: Client, row: dict) -> dict:
    return Pushed(
        delivery_id=row["pk"],
        position=row["position"],
        receiver_id=client.pk,
        event_id=str(row["event_id"]),
        sender_id=row["sender_id"],
        channel=row["channel"],
        sequence=row["sequence"],
        content=row["event__content"],
        seal=row["event__seal"],
        seal_read=True,
    ).as_message()


def stream_of(client: Client) -> ReceiverStream:
    """The client's delivery stream (positions 0/0 if it never had a delivery)."""
    return ReceiverStream.objects.filter(client=client).first() or ReceiverStream(client=client)


def last_position_of(client: Client) -> int:
    """The last position of the client's stream (0 if it never had a delivery)."""
    return last_positions_of([client])[client.pk]


def last_positions_of(clients: list[Client]) -> dict[int, int]:
    """{client id: the last position of its stream (0 if it never had a delivery)}
    for many clients in one statement (a fleet logging in), without the ORM's cost
    of compiling the query."""
    ends = dict.fromkeys((client.pk for client in clients), 0)
    if ends:
        with prepared_cursor() as cursor:
            cursor.execute(LAST_POSITIONS, [int_array(ends)])
            ends.update(cursor.fetchall())
    return ends


LAST_POSITIONS = (
    f"SELECT client_id, last_position FROM {ReceiverStream._meta.db_table}"
    " WHERE client_id = ANY(%s::bigint[])"
)


def position_after_delivery(client: Client, delivery_id: int) -> int:
    """The position of the client's last delivery with an id up to `delivery_id`
    (agents of the protocol's first revision resume by delivery id), 0 if none."""
    found = Delivery.objects.filter(receiver=client, pk__lte=delivery_id).order_by("-pk")
    return next(iter(found.values_list("position", flat=True)[:1]), 0)


def deliveries_of(event: Event) -> QuerySet[Delivery]:
    """The event's deliveries, read from the one partition that holds them (by its
    expiry, Delivery.expires_at) instead of looked for in every day's."""
    return Delivery.objects.filter(event=event, expires_at=event.expires_at)


def recent_deliveries(client: Client, *, limit: int = 50) -> list[Delivery]:
    """The client's newest deliveries with their events and senders."""
    query = Delivery.objects.filter(receiver=client).select_related("event", "sender")
    return list(query.order_by("-position")[:limit])


def delivery_states(client: Client, events: Iterable[Event]) -> dict:
    """{event id: state of its delivery to `client`} for those of `events` it got."""
    events = list(events)
    rows = Delivery.objects.filter(
        receiver=client,
        event__in=[e.pk for e in events],
        expires_at__in={e.expires_at for e in events},  # their partitions only
    )
    return dict(rows.values_list("event_id", "state"))


def counts_by_state() -> dict[str, int]:
    """Every delivery counted by state (every state present, 0 when none): a scan of
    the whole table, for /metrics, which caches it."""
    counts = dict.fromkeys(Delivery.State.values, 0)
    for state, count in Delivery.objects.values_list("state").annotate(n=Count("id")):
        counts[state] = count
    return counts
