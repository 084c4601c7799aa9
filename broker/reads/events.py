"""Reads of events: what publishing answers, an event's status at each receiver, and
whom an event would reach if published now."""

from __future__ import annotations

from broker.models import (
    ArchivedEvent,
    Client,
    Delivery,
    Event,
)
from broker.reads.clients import attested_attributes, attributes_by_client
from broker.reads.deliveries import deliveries_of
from broker.reads.policies import newest_policies
from broker.vocabulary import vocabulary
from policies import Selector


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
    receivers by name, with counts per state: one query for every delivery (or the
    counts retention kept, when it dropped them)."""
    deliveries = list(
        deliveries_of(event)
        .order_by("receiver__name")
        .values("receiver__name", *DELIVERY_STATUS_FIELDS)
    )
    # An event with deliveries still has all of them: only one without may be archived.
    archive = None if deliveries else ArchivedEvent.objects.filter(event=event).first()
    counts = dict.fromkeys(Delivery.State.values, 0)
    for delivery in deliveries:
        counts[delivery["state"]] += 1
    for state, _, _, count in archive.counts if archive else []:
        counts[state] += count
    return {
        **published_facts(event),
        "sender": event.sender.name,
        "content": event.content,
        "selector": event.selector,
        "counts": counts,
        "archived": archive is not None,
        "deliveries": [_delivery_status(row) for row in deliveries],
    }


def _delivery_status(row: dict) -> dict:
    return {"receiver": row["receiver__name"], **{f: row[f] for f in DELIVERY_STATUS_FIELDS}}


DELIVERY_STATUS_FIELDS = ("position", "state", "delivered_at", "received_at", "acked_at", "result")


def preview_receivers(*, sender: Client, content: dict, selector: Selector | None) -> list[str]:
    """Names of the receivers an event would reach if published now: the selector
    selects their attributes and their policy accepts the sender's attested attributes
    and the content. Reads every receiver once; for previews, not for routing."""
    sender_attributes = attested_attributes(sender)
    policies = newest_policies(field="text")
    words = vocabulary()
    values = attributes_by_client()
    receivers = Client.objects.filter(can_receive=True, is_active=True, pk__in=list(policies))
    return sorted(
        client.name
        for client in receivers.only("pk", "name")
        if (selector is None or selector.selects(values[client.pk]))
        and words.stored_policy(policies[client.pk]).accepts(sender_attributes, content)
    )


def event_with_sender(event_id) -> Event | None:
    """The event of that id with its sender, or None."""
    return Event.objects.select_related("sender").filter(pk=event_id).first()
