"""Reads of the event service that several callers reuse (the HTTP API, the pages)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from django.db import connection
from django.db.models import Exists, OuterRef, Q, QuerySet
from django.utils import timezone

from broker.credentials import key_digest
from broker.models import (
    AttributeValue,
    Client,
    ClientToken,
    Delivery,
    Event,
    EventAttribute,
    ModelAttribute,
    PolicyVersion,
    ReceiverStream,
)
from broker.notify import Pushed
from broker.vocabulary import Vocabulary
from policies import Selector


def declared_types(client: Client) -> dict[str, str]:
    """{attribute name: type} of the client's model."""
    return dict(client.model.attributes.values_list("name", "type"))


def live_attribute_values(*, now=None) -> QuerySet[AttributeValue]:
    """Values that are neither revoked nor expired: the one rule for "current"."""
    now = now or timezone.now()
    return AttributeValue.objects.filter(revoked_at__isnull=True).filter(
        Q(expires_at__isnull=True) | Q(expires_at__gt=now)
    )


def live_values(client: Client, *, now=None) -> QuerySet[AttributeValue]:
    """The client's values that are neither revoked nor expired."""
    return live_attribute_values(now=now).filter(client=client)


def current_attributes(client: Client, *, now=None) -> dict:
    """Every live value, whoever set it: what selectors address."""
    return dict(live_values(client, now=now).values_list("name", "value"))


def attested_attributes(client: Client, *, now=None) -> dict:
    """Only values an authority attested: what receivers' policies see as `sender.x`."""
    values = live_values(client, now=now).filter(source=AttributeValue.Source.AUTHORITY)
    return dict(values.values_list("name", "value"))


def attributes_by_client(client_ids: Iterable[int] | None = None, *, now=None) -> dict:
    """{client id: {name: live value}} for the clients given (or every client), in one
    query; a client without live values maps to {}."""
    values = live_attribute_values(now=now)
    if client_ids is not None:
        values = values.filter(client_id__in=list(client_ids))
    by_client: dict[int, dict] = defaultdict(dict)
    for client_id, name, value in values.order_by("client_id", "name").values_list(
        "client_id", "name", "value"
    ):
        by_client[client_id][name] = value
    return by_client


def clients_with_attributes(query: QuerySet[Client], *, offset: int, limit: int) -> list[dict]:
    """A page of `query`'s clients, in its order, each with its model's name and its
    live attributes: two queries whatever the page's length."""
    page = list(query.select_related("model")[offset : offset + limit])
    attributes = attributes_by_client(client.pk for client in page) if page else {}
    return [
        {
            "name": client.name,
            "model": client.model.name,
            "can_send": client.can_send,
            "can_receive": client.can_receive,
            "is_active": client.is_active,
            "attributes": attributes.get(client.pk, {}),
        }
        for client in page
    ]


def published_facts(event: Event) -> dict:
    """What publishing an event answers: its id, place in its channel and lifetime."""
    return {
        "event": event.pk,
        "channel": event.channel,
        "sequence": event.sequence,
        "published_at": event.published_at,
        "expires_at": event.expires_at,
    }


def event_status(event: Event) -> dict:
    """An event (its sender loaded with it) and what became of it at each receiver,
    receivers by name, with counts per state: one query for every delivery."""
    deliveries = list(
        Delivery.objects.filter(event=event)
        .order_by("receiver__name")
        .values("receiver__name", *DELIVERY_STATUS_FIELDS)
    )
    counts = dict.fromkeys(Delivery.State.values, 0)
    for delivery in deliveries:
        counts[delivery["state"]] += 1
    return {
        **published_facts(event),
        "sender": event.sender.name,
        "content": event.content,
        "selector": event.selector,
        "counts": counts,
        "deliveries": [_delivery_status(row) for row in deliveries],
    }


def _delivery_status(row: dict) -> dict:
    return {"receiver": row["receiver__name"], **{f: row[f] for f in DELIVERY_STATUS_FIELDS}}


DELIVERY_STATUS_FIELDS = ("position", "state", "delivered_at", "received_at", "acked_at", "result")


def current_policy(client: Client) -> PolicyVersion | None:
    """The client's newest policy version, or None if it never set one."""
    return client.policy_versions.order_by("-version").first()


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
        event__expires_at__gt=timezone.now(),
    )
    if unanswered_only:
        query = query.filter(state__in=UNANSWERED)
    rows = query.order_by("position").values(*REPLAY_FIELDS)[:limit]
    return [_notification(client, row) for row in rows]


UNANSWERED = (Delivery.State.PENDING, Delivery.State.DELIVERED)
REPLAY_FIELDS = ("pk", "position", "event_id", "sender_id", "channel", "sequence", "event__content")


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
    ).as_message()


def stream_of(client: Client) -> ReceiverStream:
    """The client's delivery stream (positions 0/0 if it never had a delivery)."""
    return ReceiverStream.objects.filter(client=client).first() or ReceiverStream(client=client)


def position_after_delivery(client: Client, delivery_id: int) -> int:
    """The position of the client's last delivery with an id up to `delivery_id`
    (agents of the protocol's first revision resume by delivery id), 0 if none."""
    found = Delivery.objects.filter(receiver=client, pk__lte=delivery_id).order_by("-pk")
    return next(iter(found.values_list("position", flat=True)[:1]), 0)


def preview_receivers(*, sender: Client, content: dict, selector: Selector | None) -> list[str]:
    """Names of the receivers an event would reach if published now: the selector
    selects their attributes and their policy accepts the sender's attested attributes
    and the content. Reads every receiver once; for previews, not for routing."""
    sender_attributes = attested_attributes(sender)
    policies = _current_policy_texts()
    words = vocabulary()
    values = attributes_by_client()
    receivers = Client.objects.filter(can_receive=True, is_active=True, pk__in=list(policies))
    return sorted(
        client.name
        for client in receivers.only("pk", "name")
        if (selector is None or selector.selects(values[client.pk]))
        and words.stored_policy(policies[client.pk]).accepts(sender_attributes, content)
    )


def _current_policy_texts() -> dict[int, str]:
    """{client id: text of its newest policy version}."""
    newest = PolicyVersion.objects.order_by("client_id", "-version").distinct("client_id")
    return dict(newest.values_list("client_id", "text"))


# ---------------------------------------------------------------------------
# The vocabulary: one type per attribute name (docs/addressing.md).


def receiver_vocabulary() -> dict[str, str]:
    """{name: type} declared by the models of clients that can receive (active or
    not: clients are never deleted, so the vocabulary only grows)."""
    return _role_vocabulary(can_receive=True)


def sender_vocabulary() -> dict[str, str]:
    """{name: type} declared by the models of clients that can send."""
    return _role_vocabulary(can_send=True)


def event_vocabulary() -> dict[str, str]:
    """{name: type} of the declared event attributes."""
    return dict(EventAttribute.objects.values_list("name", "type"))


def _role_vocabulary(**role: bool) -> dict[str, str]:
    used = Client.objects.filter(model_id=OuterRef("model_id"), **role)
    rows = ModelAttribute.objects.filter(Exists(used)).order_by().values_list("name", "type")
    return dict(rows.distinct())


_known: tuple[tuple, Vocabulary] | None = None


def vocabulary() -> Vocabulary:
    """The current vocabulary, cached per process and read again when a model
    attribute, an event attribute or a client was added or removed since (one short
    query tells). The same content keeps the same object, and so its parse caches."""
    global _known
    stamp = _vocabulary_stamp()
    if _known is not None and _known[0] == stamp:
        return _known[1]
    fresh = Vocabulary(
        receiver=receiver_vocabulary(), sender=sender_vocabulary(), event=event_vocabulary()
    )
    if _known is not None and _known[1] == fresh:
        fresh = _known[1]
    _known = (stamp, fresh)
    return fresh


def _vocabulary_stamp() -> tuple:
    # Sequences never hand out an id twice, so a new row always moves a maximum; the
    # counts see removals. Clients are many and never deleted: their maximum suffices.
    tables = [ModelAttribute._meta.db_table, EventAttribute._meta.db_table]
    parts = [f"(SELECT count(*) FROM {t}), (SELECT max(id) FROM {t})" for t in tables]
    clients = f"(SELECT max(id) FROM {Client._meta.db_table})"
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {', '.join(parts)}, {clients}")
        return cursor.fetchone()


def live_token(token: str) -> ClientToken | None:
    """The token's record if it still lets its client in (not revoked, client active):
    the one rule for logging in and for staying logged in."""
    return (
        ClientToken.objects.select_related("client__model")
        .filter(key_hash=key_digest(token), revoked_at__isnull=True, client__is_active=True)
        .first()
    )
