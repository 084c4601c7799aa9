"""Waiting for the real dispatcher tree (Celery on Redis) to finish its work."""

from __future__ import annotations

import time

from django.conf import settings

from broker.queues import dispatcher_queues
from broker.routing import pending_tree_work

IDLE_CHECKS = 3
POLL_S = 0.05


def wait_until_idle(timeout_s: float = 30.0) -> None:
    """Block until no tree work is queued or running, several checks in a row."""
    queues = [
        settings.CELERY_TASK_DEFAULT_QUEUE,
        *dispatcher_queues(settings.TREE_DEPTH, settings.TREE_BRANCHING),
    ]
    deadline = time.monotonic() + timeout_s
    quiet = 0
    while time.monotonic() < deadline:
        quiet = quiet + 1 if pending_tree_work(queues) == 0 else 0
        if quiet >= IDLE_CHECKS:
            return
        time.sleep(POLL_S)
    raise TimeoutError(f"the tree still had work after {timeout_s} s")
