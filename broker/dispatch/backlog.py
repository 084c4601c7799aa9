"""How much work the dispatcher tree has left (tests and benchmarks wait for none)."""

from __future__ import annotations

from broker.dispatch import traffic, transport


def pending_tree_work(queues: list[str]) -> int:
    """Tasks queued on `queues` or taken and not yet acknowledged, hops waiting in the
    streams of the dispatchers among them, and traffic records not yet written: zero
    when the tree has nothing left to do."""
    pipeline = transport.broker_redis().pipeline()
    for queue in queues:
        pipeline.llen(queue)
    pipeline.hlen("unacked")
    tasks = sum(pipeline.execute())
    dispatchers = [queue for queue in queues if queue.startswith("dispatcher.")]
    return tasks + transport.backlog(dispatchers) + traffic.unflushed()
