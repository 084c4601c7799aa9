"""Tree workers take over the dispatchers that no tree worker on time serves, and hand
them back when their worker announces itself again. (The kill of a whole worker host
is played in tests/launcher/test_hosts.py.)"""

from __future__ import annotations

import threading

import pytest

from broker.dispatch import transport
from broker.dispatch.consumer import HopConsumer
from broker.dispatch.transport import RouteHop
from broker.services.tree import ensure_tree
from console import processes, takeover
from console.processes import Role, announce_once

pytestmark = pytest.mark.django_db

LEFT = ["dispatcher.d0", "dispatcher.d0.0", "dispatcher.d0.0.0", "dispatcher.d0.0.1"]
RIGHT = ["dispatcher.d0", "dispatcher.d0.1", "dispatcher.d0.1.0", "dispatcher.d0.1.1"]
RIGHT_ALONE = RIGHT[1:]


@pytest.fixture(autouse=True)
def default_tree_read_afresh(monkeypatch, no_announcements):
    """The default tree, read afresh, and the test's own announcements only."""
    ensure_tree()
    monkeypatch.setattr(takeover, "_tree", (0.0, []))
    monkeypatch.setattr(takeover, "CHECK_S", 0.0)  # the announcements read at every call
    monkeypatch.setattr(processes, "_withdrawn", threading.Event())


def announce_worker(settings, host: str, serves: list[str], *, seconds_ago: float = 0) -> None:
    settings.HOST_NAME = host
    now = processes.time.time()
    original = processes.time.time
    processes.time.time = lambda: now - seconds_ago
    try:
        announce_once(Role.TREE_WORKER, serves=serves)
    finally:
        processes.time.time = original


def test_nothing_is_uncovered_while_every_worker_is_on_time(settings):
    announce_worker(settings, "right-host", RIGHT)
    assert takeover.uncovered_queues(LEFT) == []


def test_a_late_workers_dispatchers_but_the_shared_path_are_uncovered(settings):
    announce_worker(settings, "right-host", RIGHT, seconds_ago=processes.LATE_AFTER_S + 1)
    assert takeover.uncovered_queues(LEFT) == RIGHT_ALONE


def test_a_dispatcher_no_worker_ever_announced_is_uncovered(settings):
    assert takeover.uncovered_queues(LEFT) == RIGHT_ALONE


def test_a_worker_that_withdrew_is_uncovered_at_once(settings):
    announce_worker(settings, "right-host", RIGHT)
    processes.withdraw()
    assert takeover.uncovered_queues(LEFT) == RIGHT_ALONE


def test_a_reports_worker_or_web_process_covers_no_dispatcher(settings):
    settings.HOST_NAME = "right-host"
    announce_once(Role.WEB, serves=RIGHT)
    assert takeover.uncovered_queues(LEFT) == RIGHT_ALONE


def test_with_redis_down_nothing_is_taken_over(monkeypatch):
    import redis

    down = redis.Redis(unix_socket_path="/nonexistent/redis.sock", socket_connect_timeout=0.1)
    monkeypatch.setattr(processes, "redis_client", lambda: down)
    assert takeover.uncovered_queues(LEFT) == []


class CeleryConsumer:
    """Records what the cover asks of Celery's consumer (its loop runs the calls)."""

    def __init__(self) -> None:
        self.queues: set[str] = set()

    def call_soon(self, function, queue: str) -> None:
        function(queue)

    def add_task_queue(self, queue: str) -> None:
        self.queues.add(queue)

    def cancel_task_queue(self, queue: str) -> None:
        self.queues.discard(queue)


def test_the_celery_queues_are_consumed_while_uncovered_and_handed_back(settings):
    consumer = CeleryConsumer()
    cover = takeover.CeleryQueueCover(consumer, ["celery", *LEFT])
    cover.check()
    assert consumer.queues == set(RIGHT_ALONE) and cover.covering == RIGHT_ALONE
    announce_worker(settings, "right-host", RIGHT)
    cover.check()
    assert consumer.queues == set() and cover.covering == []


def test_the_health_page_tells_what_a_worker_covers(settings):
    settings.HOST_NAME = "left-host"
    announce_once(Role.TREE_WORKER, serves=LEFT, covers=RIGHT_ALONE)
    [[row]] = processes.processes_now().by_host.values()
    assert row.detail == (
        "also serving dispatcher.d0.1, dispatcher.d0.1.0, dispatcher.d0.1.1: "
        "no live tree worker serves them"
    )


# --- The hop consumer reads the streams it covers --------------------------------------

OWN_QUEUE = "dispatcher.test-own"
COVERED_QUEUE = "dispatcher.test-covered"


@pytest.fixture
def streams(monkeypatch):
    # The test's transaction is no worker's connection to replace.
    monkeypatch.setattr("broker.dispatch.consumer.close_old_connections", lambda: None)
    names = [transport.stream_name(OWN_QUEUE), transport.stream_name(COVERED_QUEUE)]
    client = transport.broker_redis()
    client.delete(*names)
    transport.ensure_groups(names)
    yield names
    client.delete(*names)


def put(queue: str) -> None:
    hop = RouteHop(999_999, [{"id": "e1", "content": {}}], "down")  # no such dispatcher
    transport.broker_redis().xadd(
        transport.stream_name(queue), {transport.FIELD: transport.encode(hop)}
    )


def test_a_hop_consumer_reads_a_covered_stream_only_while_it_covers_it(streams):
    covering = [COVERED_QUEUE]
    consumer = HopConsumer([OWN_QUEUE], also_serve=lambda: list(covering))
    put(COVERED_QUEUE)
    consumer.step()
    assert transport.backlog([COVERED_QUEUE]) == 0  # taken and routed (here: dropped)
    covering.clear()
    consumer._covered_at = 0.0  # check again now, not in COVER_CHECK_S
    put(COVERED_QUEUE)
    consumer.step()
    assert transport.backlog([COVERED_QUEUE]) == 1  # left to the worker that is back


def test_a_gone_workers_unacknowledged_hops_are_claimed_sooner(streams, monkeypatch):
    put(COVERED_QUEUE)
    transport.read("gone", [streams[1]], count=10, block_ms=10)
    monkeypatch.setattr("broker.dispatch.consumer.COVERED_CLAIM_IDLE_MS", 0)
    consumer = HopConsumer([OWN_QUEUE], also_serve=lambda: [COVERED_QUEUE])
    consumer.step()
    assert transport.backlog([COVERED_QUEUE]) == 0  # long before transport.CLAIM_IDLE_MS
