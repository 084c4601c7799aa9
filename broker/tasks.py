"""Celery tasks of the dispatcher tree. Thin: they take ids and call broker.dispatch.
All are idempotent and acknowledged late (settings), so a worker killed mid-task loses
nothing: the task runs again, and the work it had not committed is still waiting."""

from __future__ import annotations

from celery import shared_task
from django.db import transaction

from broker import wakeups
from broker.dispatch import routing


@shared_task(name="broker.drain_inbox")
def drain_inbox(dispatcher_id: int):
    """Process every hop waiting at one dispatcher, in batches."""
    wakeups.woken(wakeups.INBOX, dispatcher_id)
    routing.drain_inbox(dispatcher_id)


@shared_task(name="broker.apply_client_changes")
def apply_client_changes(dispatcher_id: int):
    """A leaf applies its clients' changes, delivers late matches, grows summaries."""
    wakeups.woken(wakeups.CHANGES, dispatcher_id)
    with transaction.atomic():
        routing.post_hops(routing.apply_client_changes(dispatcher_id))


@shared_task(name="broker.refresh_summary")
def refresh_summary(dispatcher_id: int, child_id: int, version: int):
    """A dispatcher takes in a child's grown summary."""
    with transaction.atomic():
        routing.post_hops(routing.refresh_summary(dispatcher_id, child_id, version))


@shared_task(name="broker.recompute_summaries")
def recompute_summaries():
    """Periodic: exact summaries, bottom-up, so that over-approximation stays small."""
    with transaction.atomic():
        routing.post_hops(routing.recompute_summaries())


@shared_task(name="broker.sweep")
def sweep():
    """Periodic: wake every dispatcher that has work waiting too long (a lost wake-up)."""
    from broker.routing import wake_stalled_dispatchers

    wake_stalled_dispatchers()


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
