"""How much work the dispatcher tree has left (tests and benchmarks wait for none)."""

from __future__ import annotations

from functools import cache

from broker.models import HopInbox


@cache
def _broker_client():
    import redis
    from django.conf import settings

    # Kombu spells a socket redis+socket://; redis-py wants unix://.
    return redis.Redis.from_url(settings.CELERY_BROKER_URL.replace("redis+socket://", "unix://"))


def pending_tree_work(queues: list[str]) -> int:
    """Tasks queued on `queues` or taken and not yet acknowledged, plus hops waiting in
    any inbox: zero when the tree has nothing left to do."""
    pipeline = _broker_client().pipeline()
    for queue in queues:
        pipeline.llen(queue)
    pipeline.hlen("unacked")
    return sum(pipeline.execute()) + HopInbox.objects.count()
