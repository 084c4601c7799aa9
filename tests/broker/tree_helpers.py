"""Waiting for the real dispatcher tree (Celery on Redis) to finish its work."""

from __future__ import annotations

import time

import redis
from django.conf import settings

from broker.models import HopInbox
from broker.queues import dispatcher_queues

IDLE_CHECKS = 3
POLL_S = 0.05


def pending_messages(client: redis.Redis) -> int:
    """Messages waiting in any tree queue, plus those taken but not yet acknowledged."""
    queues = [
        settings.CELERY_TASK_DEFAULT_QUEUE,
        *dispatcher_queues(settings.TREE_DEPTH, settings.TREE_BRANCHING),
    ]
    pipeline = client.pipeline()
    for queue in queues:
        pipeline.llen(queue)
    pipeline.hlen("unacked")
    return sum(pipeline.execute())


def wait_until_idle(timeout_s: float = 30.0) -> None:
    """Block until no tree work is queued or running, several checks in a row."""
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL.replace("redis+socket://", "unix://"))
    deadline = time.monotonic() + timeout_s
    quiet = 0
    while time.monotonic() < deadline:
        idle = pending_messages(client) == 0 and not HopInbox.objects.exists()
        quiet = quiet + 1 if idle else 0
        if quiet >= IDLE_CHECKS:
            return
        time.sleep(POLL_S)
    raise TimeoutError(f"the tree still had work after {timeout_s} s")
