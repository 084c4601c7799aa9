"""Entry points into the dispatcher tree for the rest of the app: an event published,
a client changed.

A change is logged in the caller's transaction (`ClientChange`) and its leaf woken
after commit. An event's first hop is sent to its sender's leaf after the publishing
transaction commits, so no dispatcher sees an event that was rolled back; should the
publisher die between its commit and that send, the periodic sweep sends the hop
again (`send_unrouted_events`): the root marks every event it routes, so an event
left unmarked for long has lost its way.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import timedelta
from functools import partial

from django.db import connection, transaction
from django.utils import timezone

from broker.dispatch import transport, wakeups
from broker.dispatch.routed import wire_of_model
from broker.dispatch.steps import UP
from broker.dispatch.transport import RouteHop
from broker.models import Client, ClientChange, Event
from broker.push import to_consoles

log = logging.getLogger(__name__)

# An event not routed this long after its publication has lost its first hop (a
# slow tree only delays the marking: a second copy would be harmless, and is rare).
UNROUTED_AFTER = timedelta(seconds=30)
# Sent again at most this often per event, so a tree that is down does not pile up copies.
RESEND_EVERY_S = 300
RESENT_FLAG = "sn-tree:unrouted-resent:{event}"


def route_published(event: Event) -> None:
    """Send a new event to its sender's leaf once the publishing transaction commits."""
    hop = _first_hop(event)
    # robust: the event is committed; a failed send (Redis down) is logged, and the
    # sweep sends it again.
    transaction.on_commit(lambda: transport.send([hop]), robust=True)


def _first_hop(event: Event) -> RouteHop:
    """An event's way into the tree: up from its sender's leaf, carrying the event."""
    return RouteHop(event.sender.dispatcher_id, [wire_of_model(event)], UP)


def send_unrouted_events(*, older_than: timedelta = UNROUTED_AFTER) -> int:
    """Send again the first hop of live events the root has not routed `older_than`
    after their publication; return how many were sent."""
    now = timezone.now()
    lost = Event.objects.filter(
        routed_at=None, published_at__lt=now - older_than, expires_at__gt=now
    ).select_related("sender")
    redis, sent = transport.broker_redis(), 0
    for event in lost.iterator():
        flag = RESENT_FLAG.format(event=event.pk)
        if event.sender.dispatcher_id and redis.set(flag, 1, nx=True, ex=RESEND_EVERY_S):
            transport.send([_first_hop(event)])
            sent += 1
    if sent:
        log.warning("sent %d events into the tree again: their first hop was lost", sent)
    return sent


def client_changed(client: Client) -> None:
    """Log the change for the client's leaf and wake that leaf after commit."""
    clients_changed([client])


# One statement for any number of clients (bulk_create builds a model instance per row,
# most of the time for a trust officer's 10,000 clients); txid takes its column default.
LOG_CHANGES = f"""
INSERT INTO {ClientChange._meta.db_table} (client_id, dispatcher_id, at)
SELECT changed.client_id, changed.dispatcher_id, %(now)s
FROM unnest(%(clients)s::bigint[], %(dispatchers)s::bigint[])
    AS changed(client_id, dispatcher_id)
"""


def clients_changed(clients: Iterable[Client]) -> int:
    """`client_changed` for many clients (anything with `pk` and `dispatcher_id`): one
    statement logs all their changes, and each leaf is woken once after commit (a
    failed wake-up, Redis down, must not fail a change that is committed). Returns how
    many changes were logged: those of clients attached to a leaf."""
    attached = [(c.pk, c.dispatcher_id) for c in clients if c.dispatcher_id is not None]
    if not attached:
        return 0
    client_ids, dispatcher_ids = map(list, zip(*attached, strict=True))
    parameters = {"clients": client_ids, "dispatchers": dispatcher_ids, "now": timezone.now()}
    with connection.cursor() as cursor:
        cursor.execute(LOG_CHANGES, parameters)
    for dispatcher_id in set(dispatcher_ids):
        transaction.on_commit(lambda d=dispatcher_id: wakeups.wake(wakeups.CHANGES, d), robust=True)
    # The consoles watching the fleet or these clients refresh, after commit.
    transaction.on_commit(partial(to_consoles.clients_changed, client_ids), robust=True)
    return len(attached)
