"""Celery tasks of the dispatcher tree. Thin: they take ids, call broker.dispatch, and
enqueue the follow-up hops after commit. All are idempotent and acknowledged late
(settings), so a worker killed mid-task loses nothing: the task runs again."""

from __future__ import annotations

from celery import shared_task
from django.db import transaction

from broker import tree_changes
from broker.dispatch import routing
from broker.dispatch.routing import RouteHop, SummaryHop
from broker.dispatch.state import topology


@shared_task(name="broker.route")
def route(dispatcher_id: int, event_ids: list[str], direction: str, came_from: int | None):
    """Process events at one dispatcher and pass them on."""
    hops = routing.route(dispatcher_id, event_ids, direction=direction, came_from=came_from)
    enqueue_hops(hops)


@shared_task(name="broker.apply_client_changes")
def apply_client_changes(dispatcher_id: int):
    """A leaf applies its clients' changes, delivers late matches, grows summaries."""
    tree_changes.woken(dispatcher_id)
    enqueue_hops(routing.apply_client_changes(dispatcher_id))


@shared_task(name="broker.refresh_summary")
def refresh_summary(dispatcher_id: int, child_id: int, version: int):
    """A dispatcher takes in a child's grown summary."""
    enqueue_hops(routing.refresh_summary(dispatcher_id, child_id, version))


@shared_task(name="broker.recompute_summaries")
def recompute_summaries():
    """Periodic: exact summaries, bottom-up, so that over-approximation stays small."""
    enqueue_hops(routing.recompute_summaries())


@shared_task(name="broker.sweep_unrouted")
def sweep_unrouted():
    """Periodic: route again events that were accepted but never reached the root."""
    from broker.routing import reroute_stalled_events

    reroute_stalled_events()


def enqueue_hops(hops: list[RouteHop | SummaryHop]) -> None:
    """Send each hop to its dispatcher's queue once the current transaction commits."""
    queues = topology().queues
    for hop in hops:
        transaction.on_commit(lambda hop=hop: _send(hop, queues))


def _send(hop: RouteHop | SummaryHop, queues: dict[int, str]) -> None:
    queue = queues.get(hop.dispatcher_id) or topology(hop.dispatcher_id).queues[hop.dispatcher_id]
    if isinstance(hop, RouteHop):
        route.apply_async(
            args=[hop.dispatcher_id, hop.event_ids, hop.direction, hop.came_from], queue=queue
        )
    else:
        refresh_summary.apply_async(
            args=[hop.dispatcher_id, hop.child_id, hop.version], queue=queue
        )
