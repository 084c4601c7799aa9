"""Events with deliveries for the console bench, made without a worker: the event is
published as a sender's agent would, and its deliveries are recorded as the leaves
record them (per leaf, under the leaf's lock, at each receiver's next position), then
moved on to the states the bench wants, as agents' confirmations and answers would.
"""

from __future__ import annotations

import json
from collections import defaultdict

from django.db import connection, transaction
from django.utils import timezone

from broker.audit import Actor
from broker.dispatch.delivery import NewDelivery, insert_deliveries, lock_leaf
from broker.models import AttributeValue, Client, Delivery, Event
from broker.services.events import publish_event
from demo.scenario import SEND_TEMPLATES

State = Delivery.State
# The event page's event: the worm alert to the Northwest (a quarter of the fleet),
# found again by this key when the bench reuses its database.
PROGRESS_KEY = "bench-console-progress"
# How its deliveries end up, by receiver id modulo 20: half answered ok, a tenth each
# failed, not yet received and expired, a fifth received without an answer. (A live
# event has no expired deliveries yet; the page counts them all the same.)
STATE_SHARES = (
    (State.ACKED, 10),
    (State.FAILED, 2),
    (State.DELIVERED, 4),
    (State.PENDING, 2),
    (State.EXPIRED, 2),
)
FAILED_RESULT = {"exit_code": 2, "output": "worm signature found, quarantine failed"}
ACKED_RESULT = {"exit_code": 0}
BENCH = Actor("system", "bench")


def template(slug: str):
    """One of the send page's templates (demo.scenario.SEND_TEMPLATES)."""
    return next(t for t in SEND_TEMPLATES if t.slug == slug)


def preview_form(slug: str) -> dict[str, str]:
    """The send page's form for a template, content given as JSON."""
    chosen = template(slug)
    return {
        "sender": chosen.sender,
        "content_mode": "json",
        "content_json": json.dumps(chosen.content),
        "selector": chosen.selector,
        "lifetime_s": str(chosen.lifetime_s),
        "channel": chosen.channel,
    }


def progress_event() -> Event:
    """The worm alert to the Northwest with a delivery per Northwest server, in mixed
    states (STATE_SHARES); the same event again when it exists."""
    alert = template("worm-alert")
    event = _publish(alert, idempotency_key=PROGRESS_KEY)
    record_deliveries(event, region_members("Northwest"))
    set_states(event, state_by_share)
    return event


def command_event(receiver_ids: list[int]) -> Event:
    """A fresh status command to exactly these receivers, received by each of their
    agents and not yet answered."""
    event = _publish(template("status"), recipients=sorted(receiver_ids))
    record_deliveries(event, receiver_ids)
    set_states(event, lambda receiver_id: State.DELIVERED)
    return event


def _publish(chosen, *, idempotency_key: str | None = None, recipients=None) -> Event:
    return publish_event(
        sender=Client.objects.get(name=chosen.sender),
        content=chosen.content,
        selector=chosen.selector,
        lifetime_s=chosen.lifetime_s,
        channel=chosen.channel,
        idempotency_key=idempotency_key,
        actor=BENCH,
        recipients=recipients,
    )


def region_members(region: str) -> list[int]:
    """The receivers attested to be in `region`, attached to a leaf."""
    rows = AttributeValue.objects.filter(
        name="region",
        value=region,
        client__can_receive=True,
        client__is_active=True,
        client__dispatcher__isnull=False,
        revoked_at__isnull=True,
    )
    return list(rows.order_by("client_id").values_list("client_id", flat=True))


def spread_receivers(count: int) -> list[int]:
    """`count` receivers attached to a leaf, spread evenly over them all by id."""
    rows = Client.objects.filter(can_receive=True, is_active=True, dispatcher__isnull=False)
    ids = list(rows.order_by("pk").values_list("pk", flat=True))
    return ids[:: max(1, len(ids) // count)][:count]


def record_deliveries(event: Event, receiver_ids: list[int]) -> int:
    """A delivery of `event` to each receiver that has none yet, leaf by leaf as the
    leaves record them; returns how many were recorded."""
    by_leaf: dict[int, list[int]] = defaultdict(list)
    leaves = Client.objects.filter(pk__in=receiver_ids).values_list("pk", "dispatcher_id")
    for receiver_id, leaf_id in leaves:
        by_leaf[leaf_id].append(receiver_id)
    recorded = 0
    for leaf_id, receivers in sorted(by_leaf.items()):
        with transaction.atomic():
            lock_leaf(leaf_id)
            recorded += len(insert_deliveries([_delivery(event, r) for r in sorted(receivers)]))
    return recorded


def _delivery(event: Event, receiver_id: int) -> NewDelivery:
    return NewDelivery(
        event_id=str(event.pk),
        receiver_id=receiver_id,
        sender_id=event.sender_id,
        channel=event.channel,
        sequence=event.sequence,
        expires_at=event.expires_at,
        delivered_at=timezone.now(),
        content=event.content,  # what insert_deliveries pushes
    )


def state_by_share(receiver_id: int) -> str:
    """The state STATE_SHARES gives this receiver's delivery."""
    slot = receiver_id % sum(share for _, share in STATE_SHARES)
    for state, share in STATE_SHARES:
        if slot < share:
            return state
        slot -= share
    raise AssertionError("the shares cover every slot")


# Received deliveries were confirmed, answered ones acknowledged with a result.
MOVE_ON = """
UPDATE broker_delivery AS d
SET state = moved.state,
    received_at = CASE WHEN moved.state IN ('delivered', 'acked', 'failed') THEN %s END,
    acked_at = CASE WHEN moved.state IN ('acked', 'failed') THEN %s END,
    result = CASE moved.state WHEN 'acked' THEN %s::jsonb WHEN 'failed' THEN %s::jsonb END
FROM unnest(%s::bigint[], %s::text[]) AS moved(id, state)
WHERE d.id = moved.id
"""


def set_states(event: Event, state_of) -> int:
    """Move the event's pending deliveries to `state_of(receiver_id)`; returns how
    many moved. Deliveries already moved on are left as they are."""
    pending = Delivery.objects.filter(event=event, state=State.PENDING)
    moved = [(pk, state_of(r)) for pk, r in pending.values_list("pk", "receiver_id")]
    moved = [(pk, state) for pk, state in moved if state != State.PENDING]
    if not moved:
        return 0
    now = timezone.now()
    ids, states = map(list, zip(*moved, strict=True))
    results = [json.dumps(ACKED_RESULT), json.dumps(FAILED_RESULT)]
    with connection.cursor() as cursor:
        cursor.execute(MOVE_ON, [now, now, *results, ids, states])
    return len(moved)
