"""Pushing deliveries to connected receivers through the channel layer (Redis).

Every receiver's connection joins the group `client.<id>`. A leaf pushes, after its
deliveries commit, each receiver's new deliveries in order, so that order survives the
trip: all receivers' lists travel in one message per receiving process
(broker.push.layer), and each connection reads its own group's list,
`message["groups"]["client.<id>"]`. The database stays the record: a receiver that
was not connected reads what it missed from there when it comes back.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any

import orjson
from channels.layers import get_channel_layer
from django.conf import settings

logger = logging.getLogger(__name__)

MESSAGE_TYPE = "deliveries.push"


@dataclass(frozen=True)
class Pushed:
    """One delivery as an agent is sent it, live or replayed: the one definition of a
    notification's fields (docs/protocol.md, `notification`)."""

    delivery_id: int
    position: int
    receiver_id: int
    event_id: str
    sender_id: int
    channel: str
    sequence: int
    content: dict[str, Any]
    # The event's seal (broker.seals), when it was read with the delivery (a replay).
    # A live push leaves it out: the receiving process adds it, read once per event.
    seal: dict[str, Any] | None = None
    seal_read: bool = False

    def as_message(self) -> dict[str, Any]:
        message = {
            "delivery": self.delivery_id,
            "position": self.position,
            "event": self.event_id,
            "sender": self.sender_id,
            "channel": self.channel,
            "sequence": self.sequence,
            "content": self.content,
        }
        if self.seal_read:
            message["seal"] = self.seal
        return message


def client_group(client_id: int) -> str:
    """The channel-layer group of one client's live connections."""
    return f"client.{client_id}"


def push(deliveries: Iterable[Pushed]) -> None:
    """Send each receiver its deliveries, in the given order, in one message."""
    by_receiver: dict[int, list[dict]] = {}
    for delivery in deliveries:
        by_receiver.setdefault(delivery.receiver_id, []).append(delivery.as_message())
    if by_receiver:
        _send_all(by_receiver)


def end_sessions(client_id: int) -> None:
    """Tell every live connection of the client that its tokens were revoked."""
    end_sessions_of([client_id])


def on_push_loop(coroutine) -> None:
    """Run `coroutine` on the process's push loop and wait for it (errors surface)."""
    asyncio.run_coroutine_threadsafe(coroutine, _push_loop()).result(timeout=PUSH_TIMEOUT_S)


def on_push_loop_soon(coroutine, *, failure: str) -> None:
    """Run `coroutine` on the process's push loop without waiting for it: for what is
    best effort. A failure is logged with `failure` (what was not done)."""
    future = asyncio.run_coroutine_threadsafe(coroutine, _push_loop())
    future.add_done_callback(partial(_log_failure, failure))


def _log_failure(failure: str, future: concurrent.futures.Future) -> None:
    if not future.cancelled() and future.exception() is not None:
        logger.warning(failure, exc_info=future.exception())


SESSION_REVOKED = "session.revoked"
PUSH_TIMEOUT_S = 30
_loop: asyncio.AbstractEventLoop | None = None
_loop_lock = threading.Lock()


def _push_loop() -> asyncio.AbstractEventLoop:
    """One long-lived event loop per process for what threads send through the async
    channel layer (sessions ended, announcements; deliveries go on its blocking client).
    The layer keeps a connection pool per loop: a fresh loop per call (async_to_sync
    from a worker) would open new connections for every batch."""
    global _loop
    with _loop_lock:
        if _loop is None or _loop.is_closed():
            _loop = asyncio.new_event_loop()
            threading.Thread(target=_loop.run_forever, name="push-loop", daemon=True).start()
        return _loop


def _send_all(by_receiver: dict[int, list[dict]]) -> None:
    # One Redis message per receiving process, whatever the number of receivers.
    payloads = {client_group(receiver): items for receiver, items in by_receiver.items()}
    sent_at = time.time()
    layer = get_channel_layer()
    layer.group_send_each(payloads, message_type=MESSAGE_TYPE)
    if settings.PUSH_LOG_KEY:
        _log_push(layer, sent_at, by_receiver)


def _log_push(layer, sent_at: float, by_receiver: dict[int, list[dict]]) -> None:
    """For benchmarks (settings.PUSH_LOG_KEY): when this push was sent, and with
    which deliveries."""
    deliveries = [item["delivery"] for items in by_receiver.values() for item in items]
    entry = orjson.dumps({"sent_at": sent_at, "deliveries": deliveries})
    layer.blocking_client(0).rpush(settings.PUSH_LOG_KEY, entry)


def end_sessions_of(client_ids: list[int]) -> None:
    """`end_sessions` for many clients, sent together."""
    layer = get_channel_layer()
    message = {"type": SESSION_REVOKED}
    sends = [layer.group_send(client_group(client_id), message) for client_id in client_ids]
    on_push_loop(_all(sends))


async def _all(coroutines: list) -> None:
    await asyncio.gather(*coroutines)
