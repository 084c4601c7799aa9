"""Celery tasks of the dispatcher tree. Thin: they take ids and call broker.dispatch.
All are idempotent and acknowledged late (settings), so a worker killed mid-task loses
nothing: the task runs again, and the work it had not committed is still waiting.

This is the only module that imports the dispatch steps; the dispatch code enqueues
these tasks by name (broker.dispatch.wakeups), so no import runs in a circle. The
names are stable: the beat schedule and running workers use them."""

from __future__ import annotations

from celery import shared_task
from django.db import transaction

from broker.dispatch import steps, wakeups


@shared_task(name=wakeups.APPLY_CLIENT_CHANGES)
def apply_client_changes(dispatcher_id: int):
    """A leaf applies its clients' changes, delivers late matches, grows summaries."""
    wakeups.woken(wakeups.CHANGES, dispatcher_id)
    with transaction.atomic():
        steps.post_hops(steps.apply_client_changes(dispatcher_id))


@shared_task(name=wakeups.REFRESH_SUMMARY)
def refresh_summary(dispatcher_id: int, child_id: int, version: int, again: bool = False):
    """A dispatcher takes in a child's grown summary, and resends what the child may
    have missed once more when every process routes with the grown summary."""
    with transaction.atomic():
        steps.post_hops(steps.refresh_summary(dispatcher_id, child_id, version))
    if not again:
        wakeups.send(
            wakeups.REFRESH_SUMMARY, dispatcher_id, child_id, version, True,
            countdown=steps.SUMMARY_IN_FORCE_AFTER_S,
        )  # fmt: skip


@shared_task(name="broker.recompute_summaries")
def recompute_summaries():
    """Periodic: exact summaries, bottom-up, so that over-approximation stays small."""
    with transaction.atomic():
        steps.post_hops(steps.recompute_summaries())


@shared_task(name="broker.sweep")
def sweep():
    """Periodic: send again the first hop of events that lost it (their publisher died
    between its commit and the send)."""
    from broker.dispatch.entry import send_unrouted_events

    send_unrouted_events()


@shared_task(name="broker.expire_deliveries")
def expire_deliveries():
    """Periodic: deliveries whose event expired before their agent confirmed them."""
    from broker.services.deliveries import expire_unconfirmed

    expire_unconfirmed()


@shared_task(name="broker.expire_attributes")
def expire_attributes():
    """Periodic: the leaves of clients whose attested values expired reload them."""
    from broker.services.authorities import announce_expirations_since_last_run

    announce_expirations_since_last_run()
