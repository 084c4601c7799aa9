"""Waking dispatchers up for their clients' changes, at most one pending wake-up per
dispatcher and kind. (Hops need no wake-up: their streams wake their consumers,
broker/dispatch/transport.py.)

The change log is durable in PostgreSQL; a Celery task only tells a leaf to look. A
Redis flag makes a burst of changes cost one task: the task clears the flag before it
looks, so changes committed after that wake it again. A leaf that looked less than
TREE_CHANGES_GATHER_MS ago is woken that long from now, not at once: under a steady
stream of changes (a fleet's load reports) each pass takes in those of a whole interval
instead of one or two, and a pass costs the tree more than the changes it takes in. A
quiet leaf is woken at once. Changes whose wake-up was lost are applied by the periodic
summary recomputation.

Tasks are sent by name: broker/tasks.py registers them under these names and is the
only module that imports the dispatch steps, so nothing here imports it back.
"""

from __future__ import annotations

from celery import current_app
from django.conf import settings

from broker.dispatch.state import queue_of

# Celery task names: the beat schedule and running workers know them, keep them stable.
APPLY_CLIENT_CHANGES = "broker.apply_client_changes"
REFRESH_SUMMARY = "broker.refresh_summary"

FLAG = "sn-tree:wake:{kind}:{dispatcher}"
FLAG_TTL_S = 30
# Set as a task looks, for TREE_CHANGES_GATHER_MS: while it is there, a wake-up waits.
LOOKED = "sn-tree:looked:{kind}:{dispatcher}"
CHANGES = "changes"
TASK_OF_KIND = {CHANGES: APPLY_CLIENT_CHANGES}

_client = None


def _redis():
    global _client
    if _client is None:
        import redis

        _client = redis.Redis.from_url(settings.REDIS_URL)
    return _client


def send(task_name: str, dispatcher_id: int, *args, countdown: float | None = None) -> None:
    """Enqueue the task named `task_name` on the dispatcher's own queue, with the
    dispatcher's id and `args` as arguments (to run `countdown` seconds from now)."""
    current_app.send_task(
        task_name, args=[dispatcher_id, *args], queue=queue_of(dispatcher_id), countdown=countdown
    )


def wake(kind: str, dispatcher_id: int) -> None:
    """Enqueue the dispatcher's task for `kind` unless one is already pending: at once,
    or after the gathering interval if the dispatcher looked less than that ago."""
    flag = FLAG.format(kind=kind, dispatcher=dispatcher_id)
    if _redis().set(flag, "1", nx=True, ex=FLAG_TTL_S):
        looked_lately = _redis().exists(LOOKED.format(kind=kind, dispatcher=dispatcher_id))
        countdown = settings.TREE_CHANGES_GATHER_MS / 1000 if looked_lately else None
        send(TASK_OF_KIND[kind], dispatcher_id, countdown=countdown)


def woken(kind: str, dispatcher_id: int) -> None:
    """Called by the task before it looks at its work."""
    pipeline = _redis().pipeline()
    pipeline.delete(FLAG.format(kind=kind, dispatcher=dispatcher_id))
    if settings.TREE_CHANGES_GATHER_MS:
        looked = LOOKED.format(kind=kind, dispatcher=dispatcher_id)
        pipeline.set(looked, "1", px=settings.TREE_CHANGES_GATHER_MS)
    pipeline.execute()
