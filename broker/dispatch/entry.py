"""Entry points into the dispatcher tree for the rest of the app: an event published,
a client changed.

Both write their work in the caller's transaction (the event's first hop, the
`ClientChange` log) and wake the dispatcher only after commit: a worker never sees
work that was rolled back, and work whose wake-up was lost is still picked up by the
dispatcher's next task or the periodic sweep.
"""

from __future__ import annotations

from django.db import transaction

from broker.dispatch import wakeups
from broker.dispatch.steps import UP, RouteHop, post_hops
from broker.models import Client, ClientChange, Event


def route_published(event: Event) -> None:
    """Put a new event in its sender's leaf's inbox, in the publishing transaction; the
    leaf is woken once it commits."""
    post_hops([RouteHop(event.sender.dispatcher_id, [str(event.pk)], UP)])


def client_changed(client: Client) -> None:
    """Log the change for the client's leaf and wake that leaf after commit."""
    if client.dispatcher_id is None:
        return
    change = ClientChange.objects.create(client=client, dispatcher_id=client.dispatcher_id)
    # robust: a failed wake-up (Redis down) must not fail a change that is committed.
    transaction.on_commit(lambda: wakeups.wake(wakeups.CHANGES, change.dispatcher_id), robust=True)
