"""Telling a client's leaf dispatcher that the client changed.

The change is written to the `ClientChange` log in the caller's transaction, and the
leaf's task is enqueued only after commit: a worker never sees a change that was rolled
back, and a change whose task was lost is still picked up by the next task at that leaf.
"""

from __future__ import annotations

from django.db import transaction

from broker.models import Client, ClientChange


def client_changed(client: Client) -> None:
    """Log the change for the client's leaf and wake that leaf after commit."""
    if client.dispatcher_id is None:
        return
    change = ClientChange.objects.create(client=client, dispatcher_id=client.dispatcher_id)
    transaction.on_commit(lambda: _enqueue(change.dispatcher_id))


def _enqueue(dispatcher_id: int) -> None:
    from broker.tasks import apply_client_changes

    apply_client_changes.apply_async(args=[dispatcher_id], queue=queue_of(dispatcher_id))


def queue_of(dispatcher_id: int) -> str:
    """The Celery queue of a dispatcher (dispatchers are named after their position)."""
    from broker.models import Dispatcher

    return Dispatcher.objects.only("name").get(pk=dispatcher_id).queue
