"""Telling a client's leaf dispatcher that the client changed.

The change is written to the `ClientChange` log in the caller's transaction, and the
leaf is woken only after commit: a worker never sees a change that was rolled back,
and a change whose wake-up was lost is still picked up by the leaf's next task.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from django.db import transaction
from django.utils import timezone

from broker import wakeups
from broker.bulk import copy_rows
from broker.models import Client, ClientChange


def client_changed(client: Client) -> None:
    """Log the change for the client's leaf and wake that leaf after commit."""
    if client.dispatcher_id is None:
        return
    change = ClientChange.objects.create(client=client, dispatcher_id=client.dispatcher_id)
    # robust: a failed wake-up (Redis down) must not fail a change that is committed.
    transaction.on_commit(lambda: _enqueue(change.dispatcher_id), robust=True)


def clients_changed(leaves: Mapping[int, int]) -> None:
    """Log a change for each of many clients ({client id: its leaf's id}) with one
    COPY, and wake each of their leaves once after commit."""
    now = timezone.now()
    rows = ((client_id, leaf_id, now) for client_id, leaf_id in leaves.items())
    copy_rows(ClientChange, ["client", "dispatcher", "at"], rows)
    for leaf_id in set(leaves.values()):
        transaction.on_commit(lambda leaf_id=leaf_id: _enqueue(leaf_id), robust=True)


def _enqueue(dispatcher_id: int) -> None:
    wakeups.wake(wakeups.CHANGES, dispatcher_id)


def leaves_of(clients: Iterable[Client]) -> dict[int, int]:
    """{client id: its leaf's id} of those clients attached to a leaf, for
    `clients_changed`."""
    return {c.pk: c.dispatcher_id for c in clients if c.dispatcher_id is not None}
