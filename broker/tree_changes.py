"""Telling a client's leaf dispatcher that the client changed.

The change is written to the `ClientChange` log in the caller's transaction, and the
leaf is woken only after commit: a worker never sees a change that was rolled back,
and a change whose wake-up was lost is still picked up by the leaf's next task.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import partial

from django.db import transaction

from broker import wakeups
from broker.models import Client, ClientChange

BATCH = 5_000


def client_changed(client: Client) -> None:
    """Log the change for the client's leaf and wake that leaf after commit."""
    clients_changed([client])


def clients_changed(clients: Iterable[Client]) -> int:
    """Log a change for each client (those attached to a leaf) in bulk, and wake each
    of their leaves once after commit; return how many were logged. Only `pk` and
    `dispatcher_id` are read from the clients."""
    changes = [
        ClientChange(client_id=client.pk, dispatcher_id=client.dispatcher_id)
        for client in clients
        if client.dispatcher_id is not None
    ]
    ClientChange.objects.bulk_create(changes, batch_size=BATCH)
    for dispatcher_id in {change.dispatcher_id for change in changes}:
        # robust: a failed wake-up (Redis down) must not fail a change that is committed.
        transaction.on_commit(partial(_enqueue, dispatcher_id), robust=True)
    return len(changes)


def _enqueue(dispatcher_id: int) -> None:
    wakeups.wake(wakeups.CHANGES, dispatcher_id)
