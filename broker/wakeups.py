"""Waking dispatchers up, at most one pending wake-up per dispatcher and kind.

Work itself is durable in PostgreSQL (the change log, the hop inbox); a Celery task
only tells a dispatcher to look. A Redis flag makes a burst of work cost one task: the
task clears the flag before it looks, so work committed after that wakes it again. A
wake-up lost with its task delays the dispatcher only until the flag expires and the
periodic sweep (`broker.sweep`) wakes every dispatcher that has work waiting.
"""

from __future__ import annotations

from django.conf import settings

from broker.dispatch.state import queue_of

FLAG = "sn-tree:wake:{kind}:{dispatcher}"
FLAG_TTL_S = 30
CHANGES = "changes"
INBOX = "inbox"

_client = None


def _redis():
    global _client
    if _client is None:
        import redis

        _client = redis.Redis.from_url(settings.REDIS_URL)
    return _client


def wake(kind: str, dispatcher_id: int) -> None:
    """Enqueue the dispatcher's task for `kind` unless one is already pending."""
    flag = FLAG.format(kind=kind, dispatcher=dispatcher_id)
    if _redis().set(flag, "1", nx=True, ex=FLAG_TTL_S):
        _task_for(kind).apply_async(args=[dispatcher_id], queue=queue_of(dispatcher_id))


def woken(kind: str, dispatcher_id: int) -> None:
    """Called by the task before it looks at its work."""
    _redis().delete(FLAG.format(kind=kind, dispatcher=dispatcher_id))


def _task_for(kind: str):
    from broker import tasks

    return {CHANGES: tasks.apply_client_changes, INBOX: tasks.drain_inbox}[kind]
