"""Waiting for the real dispatcher tree (Celery on Redis) to finish its work."""

from __future__ import annotations

import time

from django.conf import settings

from broker.dispatch import transport
from broker.dispatch.backlog import pending_tree_work
from broker.dispatch.entry import send_unrouted_events
from broker.dispatch.queues import dispatcher_queues
from broker.dispatch.routed import wire_of_model
from broker.models import Dispatcher, Event

IDLE_CHECKS = 3
POLL_S = 0.05
# What the beat does in production (CELERY_BEAT_SCHEDULE "sweep"): an event whose first
# hop was lost (its publisher died before sending it) is sent again. Tests run no beat.
SWEEP_EVERY_S = 5.0


def wait_until_idle(timeout_s: float = 30.0) -> None:
    """Block until no tree work is queued or running, several checks in a row,
    sweeping for events that lost their way as the beat would."""
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
            send_unrouted_events()
            next_sweep = time.monotonic() + SWEEP_EVERY_S
        time.sleep(POLL_S)
    raise TimeoutError(f"the tree still had work after {timeout_s} s")


def held_hops(dispatcher: Dispatcher, event: Event, count: int) -> list[bytes]:
    """`count` hops sent to the dispatcher and taken at once, atomically, by a consumer
    that is not the worker's: they wait, unacknowledged, until released."""
    hop = transport.RouteHop(dispatcher.id, [wire_of_model(event)], "down")
    stream = transport.stream_name(dispatcher.queue)
    pipeline = transport.broker_redis().pipeline(transaction=True)
    transport.send([hop] * count, pipeline)
    pipeline.xreadgroup(transport.GROUP, "test-holder", {stream: ">"}, count=count)
    taken = pipeline.execute()[-1]
    return [entry_id for _, entries in taken for entry_id, _ in entries]


def release(dispatcher: Dispatcher, entry_ids: list[bytes]) -> None:
    stream = transport.stream_name(dispatcher.queue)
    transport.broker_redis().xack(stream, transport.GROUP, *entry_ids)
    transport.broker_redis().xdel(stream, *entry_ids)


def events_read_through(monkeypatch, module, name: str) -> list[str]:
    """The ids of the events `module.name` (a function returning RoutedEvents) returns
    from now on, as the code under test reads them."""
    read: list[str] = []
    original = getattr(module, name)

    def spy(*args, **kwargs):
        found = original(*args, **kwargs)
        read.extend(event.id for event in found)
        return found

    monkeypatch.setattr(module, name, spy)
    return read
