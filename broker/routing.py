"""Entry points into the dispatcher tree for the rest of the app."""

from __future__ import annotations

from datetime import timedelta
from functools import cache

from django.utils import timezone

from broker import wakeups
from broker.dispatch.routing import UP, RouteHop, post_hops
from broker.models import Event, HopInbox

STALLED_AFTER = timedelta(seconds=10)


def route_published(event: Event) -> None:
    """Put a new event in its sender's leaf's inbox, in the publishing transaction; the
    leaf is woken once it commits."""
    post_hops([RouteHop(event.sender.dispatcher_id, [str(event.pk)], UP)])


def wake_stalled_dispatchers(*, older_than: timedelta = STALLED_AFTER) -> int:
    """Wake dispatchers whose inbox holds hops older than `older_than`, whatever
    happened to their wake-ups; return how many were woken. (Client changes whose
    wake-up was lost are applied by the periodic summary recomputation.)"""
    cutoff = timezone.now() - older_than
    stalled = set(
        HopInbox.objects.filter(enqueued_at__lt=cutoff).values_list("dispatcher_id", flat=True)
    )
    for dispatcher_id in stalled:
        wakeups.wake(wakeups.INBOX, dispatcher_id)
    return len(stalled)


@cache
def _broker_client():
    import redis
    from django.conf import settings

    # Kombu spells a socket redis+socket://; redis-py wants unix://.
    return redis.Redis.from_url(settings.CELERY_BROKER_URL.replace("redis+socket://", "unix://"))


def pending_tree_work(queues: list[str]) -> int:
    """Tasks queued on `queues` or taken and not yet acknowledged, plus hops waiting in
    any inbox: zero when the tree has nothing left to do (tests and benchmarks wait
    for it)."""
    pipeline = _broker_client().pipeline()
    for queue in queues:
        pipeline.llen(queue)
    pipeline.hlen("unacked")
    return sum(pipeline.execute()) + HopInbox.objects.count()
