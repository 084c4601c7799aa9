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


WAKE_UP_KEY = "sn-tree:leaf-wake-up:{}"
# A lost flag (its task vanished) only delays the leaf until the key expires; the next
# change, or the periodic recomputation, applies everything that is logged.
WAKE_UP_TTL_S = 30


def _enqueue(dispatcher_id: int) -> None:
    """Wake the leaf unless a wake-up is already pending: one task applies every
    change logged before it starts, so a burst of changes needs only one."""
    from broker.tasks import apply_client_changes

    key = WAKE_UP_KEY.format(dispatcher_id)
    if _redis().set(key, "1", nx=True, ex=WAKE_UP_TTL_S):
        apply_client_changes.apply_async(args=[dispatcher_id], queue=queue_of(dispatcher_id))


def woken(dispatcher_id: int) -> None:
    """Called by the leaf's task before it reads the change log: changes committed
    from now on wake it again."""
    _redis().delete(WAKE_UP_KEY.format(dispatcher_id))


_client = None


def _redis():
    global _client
    if _client is None:
        import redis
        from django.conf import settings

        _client = redis.Redis.from_url(settings.REDIS_URL)
    return _client


def queue_of(dispatcher_id: int) -> str:
    """The Celery queue of a dispatcher (dispatchers are named after their position)."""
    from broker.models import Dispatcher

    return Dispatcher.objects.only("name").get(pk=dispatcher_id).queue
