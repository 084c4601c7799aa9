"""Waiting for the real dispatcher tree (Celery on Redis) to finish its work."""

from __future__ import annotations

import time

from django.conf import settings

from broker.dispatch.backlog import pending_tree_work
from broker.dispatch.queues import dispatcher_queues
from broker.dispatch.wakeups import wake_stalled_dispatchers

IDLE_CHECKS = 3
POLL_S = 0.05
# What the beat does in production (CELERY_BEAT_SCHEDULE "sweep"): a task lost with a
# killed worker (taken from Redis, not yet recorded as unacknowledged) leaves its hop in
# an inbox with no wake-up; the sweep wakes that dispatcher. Tests run no beat.
SWEEP_EVERY_S = 5.0


def wait_until_idle(timeout_s: float = 30.0) -> None:
    """Block until no tree work is queued or running, several checks in a row,
    sweeping for stalled dispatchers as the beat would."""
    queues = [
        settings.CELERY_TASK_DEFAULT_QUEUE,
        *dispatcher_queues(settings.TREE_DEPTH, settings.TREE_BRANCHING),
    ]
    deadline = time.monotonic() + timeout_s
    next_sweep = time.monotonic() + SWEEP_EVERY_S
    quiet = 0
    while time.monotonic() < deadline:
        quiet = quiet + 1 if pending_tree_work(queues) == 0 else 0
        if quiet >= IDLE_CHECKS:
            return
        if time.monotonic() >= next_sweep:
            wake_stalled_dispatchers()
            next_sweep = time.monotonic() + SWEEP_EVERY_S
        time.sleep(POLL_S)
    raise TimeoutError(f"the tree still had work after {timeout_s} s")
