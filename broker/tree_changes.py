"""Telling a client's leaf dispatcher that the client changed.

The change is written to the `ClientChange` log in the caller's transaction, and the
leaf is woken only after commit: a worker never sees a change that was rolled back,
and a change whose wake-up was lost is still picked up by the leaf's next task.
"""

from __future__ import annotations

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
