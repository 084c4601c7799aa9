"""Entry points into the dispatcher tree for the rest of the app: an event published,
a client changed.

Both write their work in the caller's transaction (the event's first hop, the
`ClientChange` log) and wake the dispatcher only after commit: a worker never sees
work that was rolled back, and work whose wake-up was lost is still picked up by the
dispatcher's next task or the periodic sweep.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import partial

from django.db import connection, transaction
from django.utils import timezone

from broker import announcements
from broker.dispatch import wakeups
from broker.dispatch.steps import UP, RouteHop, post_hops
from broker.models import Client, ClientChange, Event


def route_published(event: Event) -> None:
    """Put a new event in its sender's leaf's inbox, in the publishing transaction; the
    leaf is woken once it commits."""
    post_hops([RouteHop(event.sender.dispatcher_id, [str(event.pk)], UP)])


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
    transaction.on_commit(partial(announcements.clients_changed, client_ids), robust=True)
    return len(attached)
