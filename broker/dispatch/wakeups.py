"""Waking dispatchers up, at most one pending wake-up per dispatcher and kind.

Work itself is durable in PostgreSQL (the change log, the hop inbox); a Celery task
only tells a dispatcher to look. A Redis flag makes a burst of work cost one task: the
task clears the flag before it looks, so work committed after that wakes it again. A
wake-up lost with its task delays the dispatcher only until the flag expires and the
periodic sweep (`broker.sweep`) wakes every dispatcher that has work waiting.

Tasks are sent by name: broker/tasks.py registers them under these names and is the
only module that imports the dispatch steps, so nothing here imports it back.
"""

from __future__ import annotations

from datetime import timedelta

from celery import current_app
from django.conf import settings
from django.utils import timezone

from broker.dispatch.state import queue_of
from broker.models import HopInbox

# Celery task names: the beat schedule and running workers know them, keep them stable.
DRAIN_INBOX = "broker.drain_inbox"
APPLY_CLIENT_CHANGES = "broker.apply_client_changes"
REFRESH_SUMMARY = "broker.refresh_summary"

FLAG = "sn-tree:wake:{kind}:{dispatcher}"
FLAG_TTL_S = 30
CHANGES = "changes"
INBOX = "inbox"
TASK_OF_KIND = {CHANGES: APPLY_CLIENT_CHANGES, INBOX: DRAIN_INBOX}
STALLED_AFTER = timedelta(seconds=10)

_client = None


def _redis():
    global _client
    if _client is None:
        import redis

        _client = redis.Redis.from_url(settings.REDIS_URL)
    return _client


def send(task_name: str, dispatcher_id: int, *args) -> None:
    """Enqueue the task named `task_name` on the dispatcher's own queue, with the
    dispatcher's id and `args` as arguments."""
    current_app.send_task(task_name, args=[dispatcher_id, *args], queue=queue_of(dispatcher_id))


def wake(kind: str, dispatcher_id: int) -> None:
    """Enqueue the dispatcher's task for `kind` unless one is already pending."""
    flag = FLAG.format(kind=kind, dispatcher=dispatcher_id)
    if _redis().set(flag, "1", nx=True, ex=FLAG_TTL_S):
        send(TASK_OF_KIND[kind], dispatcher_id)


def woken(kind: str, dispatcher_id: int) -> None:
    """Called by the task before it looks at its work."""
    _redis().delete(FLAG.format(kind=kind, dispatcher=dispatcher_id))


def wake_stalled_dispatchers(*, older_than: timedelta = STALLED_AFTER) -> int:
    """Wake dispatchers whose inbox holds hops older than `older_than`, whatever
    happened to their wake-ups; return how many were woken. (Client changes whose
    wake-up was lost are applied by the periodic summary recomputation.)"""
    cutoff = timezone.now() - older_than
    stalled = set(
        HopInbox.objects.filter(enqueued_at__lt=cutoff).values_list("dispatcher_id", flat=True)
    )
    for dispatcher_id in stalled:
        wake(INBOX, dispatcher_id)
    return len(stalled)
