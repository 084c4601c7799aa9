"""Tree workers take over the dispatchers of a tree worker that is gone.

A deployment splits the tree over worker hosts (`python -m launcher tree-worker
--subtree d0.1`, docs/deploy.md): each serves its subtree and the path above it. When
a host dies, its dispatchers' hops wait in their streams (nothing is lost:
broker/dispatch/transport.py), but nobody routes them. So every tree worker reads the
announcements (console/processes.py): a dispatcher that no tree worker on time
(within processes.LATE_AFTER_S) serves is *uncovered*, and every live tree worker also
serves it, its hop stream and its Celery queue, until a worker that serves it
announces itself again. A worker that stops on purpose withdraws its announcement, so
its dispatchers are taken over at once.

Serving a dispatcher twice is safe, so this needs no election: a stream's entries go
to one consumer of its group each, a leaf routes under its advisory lock, and delivery
is idempotent. Workers that take over together share the work.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable

from django.db import close_old_connections
from redis.exceptions import RedisError

from broker.models import Dispatcher
from console import processes

CHECK_S = 1.0
TREE_CACHED_S = 30.0
log = logging.getLogger(__name__)


def uncovered_queues(own: Iterable[str]) -> list[str]:
    """The dispatcher queues that no tree worker on time serves, but for `own`; with
    Redis down, none (nothing can be routed then anyway)."""
    covered = set(own) | _served_on_time()
    return [queue for queue in _tree_queues() if queue not in covered]


_served: tuple[float, set[str]] = (-CHECK_S, set())
_served_lock = threading.Lock()


def _served_on_time() -> set[str]:
    """The dispatcher queues tree workers on time serve, read at most every CHECK_S
    for the whole process (its hop-consumer threads all ask every second)."""
    global _served
    with _served_lock:
        read_at, served = _served
        if time.monotonic() - read_at < CHECK_S:
            return served
        try:
            announcements = processes.announced()
        except RedisError:
            return set(_tree_queues())  # nothing is taken over while Redis is down
        now, served = time.time(), set()
        for announcement in announcements:
            if announcement.role == processes.Role.TREE_WORKER and not announcement.is_late(now):
                served.update(announcement.serves)
        _served = (time.monotonic(), served)
        return served


_tree: tuple[float, list[str]] = (0.0, [])


def _tree_queues() -> list[str]:
    """Every dispatcher's queue, root first (read again every TREE_CACHED_S)."""
    global _tree
    read_at, queues = _tree
    if time.monotonic() - read_at > TREE_CACHED_S or not queues:
        queues = [dispatcher.queue for dispatcher in Dispatcher.objects.only("name")]
        _tree = (time.monotonic(), queues)
    return queues


class CeleryQueueCover:
    """Consumes the Celery queues of uncovered dispatchers in a worker's main process
    (their wake-ups and recomputations), and stops when they are covered again."""

    def __init__(self, consumer, own: list[str]) -> None:
        self.consumer, self.own = consumer, list(own)
        self.covering: list[str] = []

    def check(self) -> None:
        """Start and stop consuming to match the uncovered dispatchers now."""
        wanted = uncovered_queues(self.own)
        for queue in sorted(set(wanted) - set(self.covering)):
            log.warning("taking over %s: no tree worker on time serves it", queue)
            self.consumer.call_soon(self.consumer.add_task_queue, queue)
        for queue in sorted(set(self.covering) - set(wanted)):
            log.warning("handing %s back: its tree worker is serving it again", queue)
            self.consumer.call_soon(self.consumer.cancel_task_queue, queue)
        self.covering = wanted

    def run_forever(self) -> threading.Thread:
        """Check every CHECK_S on a daemon thread (errors are logged and retried)."""

        def loop() -> None:
            while True:
                try:
                    close_old_connections()  # a long-lived thread's: replaced if broken
                    self.check()
                except Exception:
                    log.exception("checking for dispatchers to take over failed")
                time.sleep(CHECK_S)

        thread = threading.Thread(target=loop, name="takeover", daemon=True)
        thread.start()
        return thread
