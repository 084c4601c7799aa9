"""Telling a client's leaf dispatcher that the client changed.

The change is written to the `ClientChange` log in the caller's transaction, and the
leaf is woken only after commit: a worker never sees a change that was rolled back,
and a change whose wake-up was lost is still picked up by the leaf's next task.
"""

from __future__ import annotations

from functools import partial

from django.db import transaction

from broker import wakeups
from broker.models import Client, ClientChange


def client_changed(client: Client) -> None:
    """Log the change for the client's leaf and wake that leaf after commit."""
    if client.dispatcher_id is None:
        return
    change = ClientChange.objects.create(client=client, dispatcher_id=client.dispatcher_id)
    # robust: a failed wake-up (Redis down) must not fail a change that is committed.
    transaction.on_commit(lambda: _enqueue(change.dispatcher_id), robust=True)


def _enqueue(dispatcher_id: int) -> None:
    wakeups.wake(wakeups.CHANGES, dispatcher_id)


def clients_changed(clients: list[Client]) -> None:
    """Log a change for each client (one insert) and wake each leaf once after commit."""
    changes = [
        ClientChange(client=client, dispatcher_id=client.dispatcher_id)
        for client in clients
        if client.dispatcher_id is not None
    ]
    ClientChange.objects.bulk_create(changes, batch_size=5_000)
    for dispatcher_id in {change.dispatcher_id for change in changes}:
        transaction.on_commit(partial(_enqueue, dispatcher_id), robust=True)
