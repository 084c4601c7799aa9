"""Hops between dispatchers: Redis streams with consumer groups.

An event travels from dispatcher to dispatcher as a stream entry carrying the event
itself (`routed.wire_of`), so no dispatcher reads it back from PostgreSQL, and an inner
dispatcher touches no database at all. Each dispatcher has a stream named after its
queue (`sn-tree:hops:dispatcher.d0.1`), read by the consumer group `dispatchers`: any
process serving that dispatcher may take an entry, and an entry is theirs until they
acknowledge it.

Why this is as safe as the inbox rows it replaces:
- a consumer sends the hops an entry causes *before* it acknowledges the entry, so a
  crash in between repeats work (delivery is idempotent) and never loses it;
- an entry a consumer took and never acknowledged (it was killed) is claimed by
  another after CLAIM_IDLE_MS; one that keeps failing is set aside in a dead-letter
  stream after MAX_ATTEMPTS, logged, and counted as backlog, never dropped silently;
- Redis keeps its data across restarts (append-only file);
- acknowledged entries are deleted, so a stream's length is its backlog.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from typing import Any

import orjson
import redis
from django.conf import settings

from broker.dispatch.state import queue_of
from broker.models import Dispatcher

log = logging.getLogger(__name__)

GROUP = "dispatchers"
STREAM_PREFIX = "sn-tree:hops:"
DEAD_LETTERS = "sn-tree:dead-hops"
CLAIM_IDLE_MS = 10_000
MAX_ATTEMPTS = 10
FIELD = b"hop"


@dataclass(frozen=True)
class RouteHop:
    """Events (in their wire shape) to process next at a dispatcher."""

    dispatcher_id: int
    events: list[dict[str, Any]]
    direction: str
    came_from: int | None = None


@dataclass(frozen=True)
class Entry:
    """A hop taken from a stream, to acknowledge once its work is done."""

    stream: str
    entry_id: bytes
    hop: RouteHop | None  # None: unreadable, acknowledged and set aside


@cache
def broker_redis() -> redis.Redis:
    """The Redis that carries Celery's messages carries the hops too."""
    return redis.Redis.from_url(settings.HOPS_REDIS_URL)


def stream_name(queue: str) -> str:
    """The hop stream of the dispatcher whose Celery queue is `queue`."""
    return STREAM_PREFIX + queue


def stream_of(dispatcher_id: int) -> str:
    return stream_name(queue_of(dispatcher_id))


def encode(hop: RouteHop) -> bytes:
    return orjson.dumps(
        {"to": hop.dispatcher_id, "dir": hop.direction, "from": hop.came_from, "events": hop.events}
    )


def decode(data: bytes) -> RouteHop:
    body = orjson.loads(data)
    return RouteHop(body["to"], body["events"], body["dir"], body["from"])


def send(hops: Iterable[RouteHop], pipeline=None) -> None:
    """Append each hop to its dispatcher's stream: in `pipeline` if given (the caller
    executes it), else at once."""
    target = pipeline if pipeline is not None else broker_redis().pipeline(transaction=False)
    for hop in hops:
        if hop.events:
            target.xadd(stream_of(hop.dispatcher_id), {FIELD: encode(hop)})
    if pipeline is None:
        target.execute()


def ensure_groups(streams: Iterable[str]) -> None:
    """Create the consumer group of each stream (and the stream) unless it exists.
    From the stream's start: entries sent before the group existed are not skipped."""
    client = broker_redis()
    for stream in streams:
        try:
            client.xgroup_create(stream, GROUP, id="0", mkstream=True)
        except redis.ResponseError as error:
            if "BUSYGROUP" not in str(error):
                raise


def read(consumer: str, streams: list[str], *, count: int, block_ms: int) -> list[Entry]:
    """New entries of these streams for `consumer`, waiting up to `block_ms` for some."""
    try:
        replies = broker_redis().xreadgroup(
            GROUP, consumer, dict.fromkeys(streams, ">"), count=count, block=block_ms
        )
    except redis.ResponseError as error:
        if "NOGROUP" not in str(error):
            raise
        ensure_groups(streams)  # Redis lost its data, or a stream is new
        return []
    return [_entry(s.decode(), i, f) for s, entries in replies or [] for i, f in entries]


def _entry(stream: str, entry_id: bytes, fields: dict | None) -> Entry:
    try:
        return Entry(stream, entry_id, decode(fields[FIELD]))
    except (TypeError, KeyError, ValueError):
        # Deleted while pending (fields None) or not ours: nothing to route.
        log.error("unreadable hop %s in %s set aside", entry_id, stream)
        if fields:
            broker_redis().xadd(DEAD_LETTERS, {b"stream": stream, **fields})
        return Entry(stream, entry_id, None)


def acknowledge(entries: Iterable[Entry], pipeline) -> None:
    """Acknowledge and delete `entries`, in `pipeline` (the caller executes it)."""
    by_stream: dict[str, list[bytes]] = {}
    for entry in entries:
        by_stream.setdefault(entry.stream, []).append(entry.entry_id)
    for stream, ids in by_stream.items():
        pipeline.xack(stream, GROUP, *ids)
        pipeline.xdel(stream, *ids)


def claim_stale(
    consumer: str, streams: list[str], *, count: int = 500, idle_ms: int | None = None
) -> list[Entry]:
    """Entries other consumers took and left unacknowledged for `idle_ms` (they died,
    or failed; CLAIM_IDLE_MS unless given): now `consumer`'s. Those tried MAX_ATTEMPTS
    times are set aside."""
    idle_ms = CLAIM_IDLE_MS if idle_ms is None else idle_ms
    client, claimed = broker_redis(), []
    for stream in streams:
        try:
            pending = client.xpending_range(
                stream, GROUP, min="-", max="+", count=count, idle=idle_ms
            )
        except redis.ResponseError:
            continue  # no group yet: nothing pending
        retry = [p["message_id"] for p in pending if p["times_delivered"] < MAX_ATTEMPTS]
        dead = [p["message_id"] for p in pending if p["times_delivered"] >= MAX_ATTEMPTS]
        if dead:
            _set_aside(stream, dead)
        if retry:
            entries = client.xclaim(stream, GROUP, consumer, idle_ms, retry)
            claimed += [_entry(stream, i, f) for i, f in entries]
    return claimed


def forget_gone_consumers(streams: list[str], *, idle_ms: int = 3_600_000) -> int:
    """Remove consumers idle for `idle_ms` with nothing pending (processes that ended:
    each process is a consumer of its own name); return how many were removed."""
    client, removed = broker_redis(), 0
    for stream in streams:
        try:
            consumers = client.xinfo_consumers(stream, GROUP)
        except redis.ResponseError:
            continue
        for consumer in consumers:
            if consumer["pending"] == 0 and consumer["idle"] > idle_ms:
                removed += client.xgroup_delconsumer(stream, GROUP, consumer["name"])
    return removed


def _set_aside(stream: str, ids: list[bytes]) -> None:
    client = broker_redis()
    log.error("%d hops in %s failed %d times: set aside in %s", len(ids), stream,
              MAX_ATTEMPTS, DEAD_LETTERS)  # fmt: skip
    pipeline = client.pipeline(transaction=True)
    for entry_id, fields in client.xrange(stream, min=ids[0], max=ids[-1]):
        if entry_id in ids:
            pipeline.xadd(DEAD_LETTERS, {b"stream": stream, **fields})
    pipeline.xack(stream, GROUP, *ids)
    pipeline.xdel(stream, *ids)
    pipeline.execute()


def backlog(queues: Iterable[str]) -> int:
    """Hops waiting or being processed at these dispatchers' streams: zero when they
    have nothing left to do. (Hops set aside are not work left: they wait for a person,
    in DEAD_LETTERS.)"""
    return sum(waiting_by_queue(queues).values())


def set_aside() -> int:
    """How many hops were set aside after failing MAX_ATTEMPTS times."""
    return broker_redis().xlen(DEAD_LETTERS)


def waiting_by_queue(queues: Iterable[str]) -> dict[str, int]:
    """{queue: hops in its dispatcher's stream}."""
    queues = list(queues)
    pipeline = broker_redis().pipeline(transaction=False)
    for queue in queues:
        pipeline.xlen(stream_name(queue))
    return dict(zip(queues, pipeline.execute(), strict=True))


def inbox_depths() -> dict[int, int]:
    """{dispatcher id: hops waiting in its stream, or being routed} (dispatchers with
    none are left out). A hop carries the events one dispatcher sent the next at once."""
    queues = {node.queue: node.id for node in Dispatcher.objects.only("id", "name")}
    waiting = waiting_by_queue(queues)
    return {queues[queue]: count for queue, count in waiting.items() if count}
