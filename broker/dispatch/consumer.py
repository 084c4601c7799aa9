"""The hop consumer: reads the streams of the dispatchers a worker serves and routes.

One consumer runs in every process of a tree worker (a thread beside Celery's task
execution: console/celery.py starts it), serving the dispatchers whose Celery queues
that worker consumes, so a deployment spreads dispatchers over machines exactly as it
spreads their queues. Entries are taken in batches (up to READ_BATCH per stream), so
events are batched per hop under load, and a hop waits for nothing under light load:
the blocking read returns as soon as an entry arrives.

Per batch and dispatcher: route (which sends the next hops first), then acknowledge
the entries and log their traffic in one Redis transaction. Anything failing (the
database restarting, say) leaves the entries unacknowledged: they are claimed again
after transport.CLAIM_IDLE_MS, by this consumer or another.
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
import threading
import time
from collections import defaultdict
from collections.abc import Callable

from django.conf import settings
from django.db import close_old_connections, connection, connections

from broker.dispatch import latency, steps, traffic, transport
from broker.dispatch import state as dispatch_state
from broker.dispatch.routed import from_wire
from broker.dispatch.transport import Entry, RouteHop
from broker.push import to_consoles
from broker.vocabulary import routed_selector

log = logging.getLogger(__name__)

READ_BATCH = 500
BLOCK_MS = 500
CLAIM_EVERY_S = 2.0
FORGET_GONE_EVERY_S = 600.0
FLUSH_EVERY_S = 0.5
BACKOFF_S = 1.0
COVER_CHECK_S = 1.0
# Entries a gone worker took are claimed once idle this long (a live consumer's after
# transport.CLAIM_IDLE_MS): long enough that workers covering together seldom take a
# batch another is still routing (harmless: routing is idempotent, but wasted).
COVERED_CLAIM_IDLE_MS = 3_000


_numbers = itertools.count(1)


class HopConsumer:
    """Routes the hops of the dispatchers whose queues are `queues`, and of those that
    `also_serve()` names while it names them (a gone worker's: console/takeover.py)."""

    def __init__(
        self,
        queues: list[str],
        name: str | None = None,
        also_serve: Callable[[], list[str]] | None = None,
    ) -> None:
        self.own = [transport.stream_name(queue) for queue in sorted(queues)]
        self.covered: list[str] = []
        self.also_serve = also_serve
        # Unique per consumer: entries a consumer took are pending under its name.
        self.name = name or f"{socket.gethostname()}:{os.getpid()}:{next(_numbers)}"
        self._claimed_at = self._flushed_at = self._covered_at = 0.0
        self._forgot_at = time.monotonic()

    @property
    def streams(self) -> list[str]:
        """The streams it reads now: its own, then those it covers."""
        return self.own + self.covered

    def run(self, stop: threading.Event) -> None:
        """Route until `stop` is set; errors are logged and retried after a pause."""
        while not stop.is_set():
            try:
                transport.ensure_groups(self.streams)
                while not stop.is_set():
                    self.step()
            except Exception:
                log.exception("the hop consumer failed; retrying in %.0f s", BACKOFF_S)
                connections.close_all()  # a broken connection is replaced
                stop.wait(BACKOFF_S)
        connections.close_all()

    def step(self) -> int:
        """Route one batch (waiting up to BLOCK_MS for one); return the hops routed."""
        self._cover_uncovered()
        entries = transport.read(self.name, self.streams, count=READ_BATCH, block_ms=BLOCK_MS)
        entries += self._claim_stale()
        close_old_connections()
        routed = sum(self.route(batch) for batch in _by_dispatcher(entries))
        self._flush_traffic()
        return routed

    def route(self, entries: list[Entry]) -> int:
        """Route the hops of one dispatcher, direction and origin, then acknowledge them
        and log their traffic together."""
        hops = [entry.hop for entry in entries if entry.hop is not None]
        statements = StatementCounter()
        with connection.execute_wrapper(statements):
            rows = _routed(hops) if hops else []
        pipeline = transport.broker_redis().pipeline(transaction=True)
        traffic.record(pipeline, rows)
        transport.acknowledge(entries, pipeline)
        _count(pipeline, hops, len(rows), statements.count)
        latency.record(pipeline, [(e.stream, e.entry_id) for e in entries if e.hop is not None])
        pipeline.execute()
        if rows:
            to_consoles.tree_changed()
        return len(rows)

    def _claim_stale(self) -> list[Entry]:
        if time.monotonic() - self._forgot_at > FORGET_GONE_EVERY_S:
            self._forgot_at = time.monotonic()
            transport.forget_gone_consumers(self.streams)
        if time.monotonic() - self._claimed_at < CLAIM_EVERY_S:
            return []
        self._claimed_at = time.monotonic()
        claimed = transport.claim_stale(self.name, self.own)
        # A gone worker's entries sooner: it is known gone, the wait is for live ones.
        return claimed + transport.claim_stale(
            self.name, self.covered, idle_ms=COVERED_CLAIM_IDLE_MS
        )

    def _cover_uncovered(self) -> None:
        """Every COVER_CHECK_S, read the streams of the dispatchers `also_serve` names."""
        if self.also_serve is None or time.monotonic() - self._covered_at < COVER_CHECK_S:
            return
        self._covered_at = time.monotonic()
        wanted = sorted(transport.stream_name(queue) for queue in self.also_serve())
        wanted = [stream for stream in wanted if stream not in self.own]
        if wanted != self.covered:
            transport.ensure_groups(wanted)
            self.covered = wanted

    def _flush_traffic(self) -> None:
        if time.monotonic() - self._flushed_at < FLUSH_EVERY_S:
            return
        self._flushed_at = time.monotonic()
        while traffic.flush() == traffic.FLUSH_BATCH:
            pass


class StatementCounter:
    """Counts the database statements of a block (connection.execute_wrapper)."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, execute, sql, params, many, context):
        self.count += 1
        return execute(sql, params, many, context)


# What routing costs, for benchmarks and the curious: per kind of dispatcher, the
# events routed, the batches and the database statements they took (transactions'
# BEGIN and COMMIT not included: the driver sends them without a statement).
STATS = "sn-tree:stats"


def _count(pipeline, hops: list[RouteHop], events: int, statements: int) -> None:
    if not hops:
        return
    tree = dispatch_state.topology(hops[0].dispatcher_id)
    kind = "leaf" if hops[0].dispatcher_id in tree.leaves else "inner"
    pipeline.hincrby(STATS, f"{kind}:events", events)
    pipeline.hincrby(STATS, f"{kind}:batches", 1)
    pipeline.hincrby(STATS, f"{kind}:statements", statements)


def _routed(hops: list[RouteHop]) -> list[tuple]:
    """Route hops that share dispatcher, direction and origin; return traffic rows."""
    first = hops[0]
    if first.dispatcher_id not in dispatch_state.topology(first.dispatcher_id).parent:
        log.warning("hops for dispatcher %s dropped: it no longer exists", first.dispatcher_id)
        return []
    events = [
        from_wire(wire, routed_selector(wire["selector"])) for hop in hops for wire in hop.events
    ]
    return steps.route(
        first.dispatcher_id, events, direction=first.direction, came_from=first.came_from
    )


def _by_dispatcher(entries: list[Entry]) -> list[list[Entry]]:
    """Entries grouped by dispatcher, direction and origin (unreadable ones alone)."""
    groups: dict[tuple, list[Entry]] = defaultdict(list)
    for entry in entries:
        hop = entry.hop
        key = (hop.dispatcher_id, hop.direction, hop.came_from) if hop else ("unreadable",)
        groups[key].append(entry)
    return list(groups.values())


_running: list[tuple[threading.Thread, threading.Event]] = []


def start_consumer(queues: list[str], also_serve: Callable[[], list[str]] | None = None) -> None:
    """Start this process's hop consumers (settings.TREE_CONSUMER_THREADS threads),
    serving the dispatcher queues among `queues` (none: no consumer), and those that
    `also_serve()` names while it names them.

    Several threads, because one thread routes one batch at a time: a hop for an inner
    dispatcher would wait behind a leaf's database work. The database work of threads
    overlaps; their Python does not (one process, one interpreter lock), so for more
    CPU a deployment runs more processes. Threads share the process's dispatcher state
    as Celery's tasks already do: a leaf's state is only used under its advisory lock."""
    served = [queue for queue in queues if queue.startswith("dispatcher.")]
    if not served or _running:
        return
    for index in range(settings.TREE_CONSUMER_THREADS):
        stop = threading.Event()
        thread = threading.Thread(
            target=HopConsumer(served, also_serve=also_serve).run,
            args=(stop,),
            daemon=True,
            name=f"hop-consumer-{index}",
        )
        thread.start()
        _running.append((thread, stop))


def stop_consumer(timeout_s: float = 5.0) -> None:
    """Stop this process's consumers after their current batch."""
    for _thread, stop in _running:
        stop.set()
    for thread, _stop in _running:
        thread.join(timeout_s)
    _running.clear()
