"""Hops as Redis stream entries: taken by one consumer, claimed by another when the
first dies, set aside (never dropped) when they keep failing; the traffic log moved
into PostgreSQL exactly once."""

from __future__ import annotations

import time
import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from broker.dispatch import traffic, transport
from broker.dispatch.transport import RouteHop
from broker.models import Dispatcher, Event, TrafficRecord, TrafficWatermark
from demo.scenario import load_scenario

# A queue no worker serves: these tests play the consumers themselves.
QUEUE = "dispatcher.test-unserved"
STREAM = transport.stream_name(QUEUE)
EVENT = {"id": "e1", "content": {"kind": "ping"}}


@pytest.fixture
def stream():
    client = transport.broker_redis()
    client.delete(STREAM, transport.DEAD_LETTERS)
    transport.ensure_groups([STREAM])
    yield STREAM
    client.delete(STREAM, transport.DEAD_LETTERS)


def put(count: int = 1) -> None:
    pipeline = transport.broker_redis().pipeline()
    for _ in range(count):
        pipeline.xadd(STREAM, {transport.FIELD: transport.encode(RouteHop(7, [EVENT], "up"))})
    pipeline.execute()


def test_a_hop_is_read_with_the_event_it_carries_by_one_consumer_only(stream):
    put()
    taken = transport.read("alice", [stream], count=10, block_ms=10)
    assert [entry.hop for entry in taken] == [RouteHop(7, [EVENT], "up", None)]
    assert transport.read("bob", [stream], count=10, block_ms=10) == []


def test_an_acknowledged_hop_leaves_the_stream_so_its_length_is_the_backlog(stream):
    put(3)
    assert transport.backlog([QUEUE]) == 3
    taken = transport.read("alice", [stream], count=10, block_ms=10)
    assert transport.backlog([QUEUE]) == 3  # taken is not done
    pipeline = transport.broker_redis().pipeline()
    transport.acknowledge(taken, pipeline)
    pipeline.execute()
    assert transport.backlog([QUEUE]) == 0


def test_a_hop_whose_consumer_died_is_claimed_by_another_after_the_idle_time(stream, monkeypatch):
    put()
    transport.read("dead", [stream], count=10, block_ms=10)
    assert transport.claim_stale("alive", [stream]) == []  # not idle long enough
    monkeypatch.setattr(transport, "CLAIM_IDLE_MS", 0)
    claimed = transport.claim_stale("alive", [stream])
    assert [entry.hop.events for entry in claimed] == [[EVENT]]


def test_a_hop_that_keeps_failing_is_set_aside_not_dropped(stream, monkeypatch):
    monkeypatch.setattr(transport, "CLAIM_IDLE_MS", 0)
    put()
    transport.read("first", [stream], count=10, block_ms=10)
    for _ in range(transport.MAX_ATTEMPTS - 1):
        assert len(transport.claim_stale("retrying", [stream])) == 1
    assert transport.claim_stale("retrying", [stream]) == []
    assert transport.backlog([QUEUE]) == 0
    (_, fields), *_ = transport.broker_redis().xrange(transport.DEAD_LETTERS)
    assert fields[b"stream"] == stream.encode()
    assert transport.decode(fields[transport.FIELD]).events == [EVENT]


def test_an_unreadable_entry_is_set_aside_and_acknowledged(stream):
    transport.broker_redis().xadd(stream, {transport.FIELD: b"not json"})
    (entry,) = transport.read("alice", [stream], count=10, block_ms=10)
    assert entry.hop is None
    assert transport.broker_redis().xlen(transport.DEAD_LETTERS) == 1


def moved_into_postgresql(timeout_s: float = 10.0) -> None:
    """Flush until the log is empty (a worker of the session may be flushing too)."""
    deadline = time.monotonic() + timeout_s
    while traffic.unflushed() and time.monotonic() < deadline:
        traffic.flush()
        time.sleep(0.05)
    assert traffic.unflushed() == 0


@pytest.mark.django_db(transaction=True, databases=["default", "audit"])
def test_the_traffic_log_reaches_postgresql_exactly_once():
    scenario = load_scenario(servers=4)
    now = timezone.now()
    # Not published: no worker routes it, only this test logs its traffic.
    event = Event.objects.create(
        sender=scenario.controllers["intellimune-national"], channel="test", sequence=1,
        content={"kind": "command"}, sender_attributes={}, lifetime_s=60,
        published_at=now, expires_at=now + timedelta(minutes=1),
    )  # fmt: skip
    root = Dispatcher.objects.get(name="d0")
    pipeline = transport.broker_redis().pipeline()
    traffic.record(pipeline, [(str(event.pk), root.pk, "up", [1, 2], 0, 0, now)])
    # A record of an event deleted meanwhile is dropped, not an error.
    traffic.record(pipeline, [(str(uuid.uuid4()), root.pk, "down", [], 0, 1, now)])
    pipeline.execute()
    moved_into_postgresql()
    traffic.flush()
    rows = TrafficRecord.objects.filter(event=event)
    assert list(rows.values_list("dispatcher_id", "direction", "forwarded_to")) == [
        (root.pk, "up", [1, 2])
    ]
    assert TrafficRecord.objects.count() == 1
    assert TrafficWatermark.objects.get().last_entry
