"""Telling the operators' consoles that what they watch changed, over the channel
layer: the fleet as a whole (topic `fleet`), one client (`client.ID`), the
dispatcher tree's figures (`tree`), the list of events (`events`), one event's
deliveries (`event.UUID`), the reports' runs (`reports`) or one run (`report.ID`).

A fleet whose agents report their load every few seconds changes all the time, and a
busy tree drains inboxes all the time, so the fleet's and the tree's topics are
announced at most once a second per process, events' and reports' at most every
0.25 s, and a change inside that interval is announced when it ends (never dropped:
the page must end up current); one client's topic goes at once.
Announcing is best effort: a failure is logged and never fails the change.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterable

from channels.layers import get_channel_layer

from broker.push.to_agents import on_push_loop_soon

FLEET = "fleet"
EVENTS = "events"
TREE = "tree"
REPORTS = "reports"
ANNOUNCE_INTERVAL_S = 1.0
# An operator watches acknowledgements arrive: an event's page hears of them within
# a quarter of a second, however many arrive.
EVENT_INTERVAL_S = 0.25
MAX_EVENT_TOPICS = 100
MESSAGE_TYPE = "console.changed"  # ConsoleConsumer.console_changed receives it
MAX_CLIENT_TOPICS = 100  # a bulk change tells the fleet, not each client

logger = logging.getLogger(__name__)
_last_sent: dict[str, float] = {}
_pending: set[str] = set()
_queued: set[str] = set()  # to send, by the one _flush task running (_flushing)
_flushing = False
_lock = threading.Lock()


def console_group(topic: str) -> str:
    """The channel-layer group of the consoles watching `topic`."""
    return f"console.{topic}"


def client_topic(client_id: int) -> str:
    """The topic of one client's page."""
    return f"client.{client_id}"


def clients_changed(client_ids: Iterable[int]) -> None:
    """Announce that these clients changed (their pages, and the fleet)."""
    ids = list(client_ids)
    topics = [client_topic(i) for i in ids] if len(ids) <= MAX_CLIENT_TOPICS else []
    announce([FLEET])
    _send(topics)


def tree_changed() -> None:
    """Announce that the tree's figures moved (a dispatcher processed some hops)."""
    announce([TREE])


def report_topic(run_id: int) -> str:
    """The topic of one report run's progress."""
    return f"report.{run_id}"


def report_changed(run_id: int) -> None:
    """Announce that a report run moved on (progress, finished or failed)."""
    announce([REPORTS, report_topic(run_id)], interval=EVENT_INTERVAL_S)


def event_topic(event_id) -> str:
    """The topic of one event's page."""
    return f"event.{event_id}"


def events_changed(event_ids: Iterable) -> None:
    """Announce that deliveries of these events changed (recorded, received,
    answered or expired): their pages, and the list of events."""
    topics = [event_topic(i) for i in set(event_ids)]
    if len(topics) <= MAX_EVENT_TOPICS:
        announce(topics, interval=EVENT_INTERVAL_S)
    announce([EVENTS])


def announce(topics: Iterable[str], *, interval: float = ANNOUNCE_INTERVAL_S) -> None:
    """Announce `topics` now, or when their interval ends if they were just sent."""
    now = time.monotonic()
    due = []
    with _lock:
        for topic in topics:
            waited = now - _last_sent.get(topic, float("-inf"))
            if waited >= interval:
                _last_sent[topic] = now
                due.append(topic)
            elif topic not in _pending:
                _pending.add(topic)
                _later(interval - waited, topic)
    _send(due)


def settle(timeout_s: float = 2.0) -> None:
    """Wait, at most `timeout_s`, until every announcement made so far was sent (or
    failed): for a process about to stop the Redis it announces through."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with _lock:
            if not (_pending or _queued or _flushing):
                return
        time.sleep(0.05)


def _later(delay: float, topic: str) -> None:
    timer = threading.Timer(delay, _send_pending, args=[topic])
    timer.daemon = True
    timer.start()


def _send_pending(topic: str) -> None:
    with _lock:
        _pending.discard(topic)
        _last_sent[topic] = time.monotonic()
    _send([topic])


def _send(topics: list[str]) -> None:
    # Not waited for: an agent's login or answer does not wait for a Redis round trip
    # to consoles that may not be watching. Queued, and sent by one task at a time:
    # a reconnecting fleet's thousand announcements do not become a thousand
    # concurrent sends. Best effort: the page also refreshes when the operator acts.
    global _flushing
    with _lock:
        _queued.update(topics)
        if _flushing or not _queued:
            return
        _flushing = True
    try:
        on_push_loop_soon(_flush(), failure="could not announce to the consoles")
    except Exception:  # no push loop: the next announcement tries again
        logger.warning("could not announce %s to the consoles", topics[:5], exc_info=True)
        with _lock:
            _flushing = False


async def _flush() -> None:
    """Send what is queued until nothing is (on the push loop)."""
    global _flushing
    try:
        while True:
            with _lock:
                topics = sorted(_queued)
                _queued.clear()
                if not topics:
                    _flushing = False
                    return
            try:
                await _group_sends(topics)
            except Exception:  # these are lost; the next ones are still tried
                logger.warning("could not announce %s to the consoles", topics[:5], exc_info=True)
    except BaseException:  # cancelled with the loop: a later announcement starts again
        with _lock:
            _flushing = False
        raise


async def _group_sends(topics: list[str]) -> None:
    """Every topic's group told, in one round trip to Redis (an idle fleet's load
    reports change a hundred clients a second at 10,000 agents: a group_send each was
    8 % of an idle web process). A console process receives one message holding
    the topics of all the groups its pages are in (ConsoleConsumer.console_changed)."""
    payloads = {console_group(topic): {"topic": topic} for topic in topics}
    layer = get_channel_layer()
    await asyncio.to_thread(layer.group_send_each, payloads, message_type=MESSAGE_TYPE)
