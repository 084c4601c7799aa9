"""The console's WebSocket: the footer's server clock, and live updates of the pages."""

from __future__ import annotations

import logging
import re
import time
from datetime import UTC, datetime

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django_otp import DEVICE_ID_SESSION_KEY

from broker import protocol
from broker.consumers import SendsUntilClosed
from broker.push import outages
from broker.push.to_consoles import EVENTS, FLEET, REPORTS, TREE, console_group
from broker.roles import READ, needs_second_factor

# Close code for an unauthenticated socket (4000-4999 are free for applications).
CLOSE_UNAUTHENTICATED = 4401
logger = logging.getLogger(__name__)


# What a page may watch: the fleet, the dispatcher tree, one client by id, the events,
# one event by id, the reports' runs, one run by id.
UUID = r"[0-9a-f]{8}(?:-[0-9a-f]{4}){3}-[0-9a-f]{12}"
TOPIC = re.compile(
    rf"^(?:{FLEET}|{TREE}|{EVENTS}|{REPORTS}|client\.[0-9]{{1,18}}|event\.{UUID}"
    rf"|report\.[0-9]{{1,18}})$"
)
MAX_TOPICS = 20


class ConsoleConsumer(SendsUntilClosed, AsyncJsonWebsocketConsumer):
    """The console's socket.

    `ping`: echo the server's time by way of the Redis channel layer. The reply is not
    written straight back: it is sent to this consumer's own channel and only written
    when it comes back, so every echo proves the channel layer works end to end.
    `watch`: join the groups of the topics a page shows (broker.push.to_consoles); each
    announcement is passed on as `{"type": "changed", "topic": ...}`.
    """

    async def connect(self) -> None:
        user = self.scope.get("user")
        # Accept first, then close with our code: a refused handshake would only show
        # the browser a bare failure, while a close code tells the client why.
        await self.accept()
        if user is None or not user.is_authenticated or await _lacks_second_factor(self.scope):
            await self.close(code=CLOSE_UNAUTHENTICATED)

    async def __call__(self, scope, receive, send) -> None:
        """As Channels' consumer; but when Redis goes while the socket waits on its
        channel, the socket is closed with 1013 (the page connects again), not dropped
        without a closing frame by the web server as the consumer fails."""
        try:
            await super().__call__(scope, receive, send)
        except Exception as error:
            if not outages.is_outage(error):
                raise
            await self._close_for_outage()
            await self._until_disconnected(receive)

    async def _close_for_outage(self) -> None:
        logger.warning("a console's socket closed: a server is down", exc_info=True)
        await self.close(code=protocol.CLOSE_TRY_AGAIN_LATER)

    async def _until_disconnected(self, receive) -> None:
        """Drop the socket's frames after the close until it ends, then run the
        consumer's disconnect as Channels would."""
        message = await receive()
        while message["type"] != "websocket.disconnect":
            message = await receive()
        await self.disconnect(message.get("code", protocol.CLOSE_TRY_AGAIN_LATER))

    async def disconnect(self, code: int) -> None:
        await self.leave_groups([console_group(topic) for topic in getattr(self, "watching", ())])

    async def receive_json(self, content, **kwargs) -> None:
        """Answer a frame; with Redis (or the database) down, close with 1013 (try
        again later) rather than fail with 1011: the page reconnects and watches its
        topics again."""
        try:
            await self._answer(content)
        except Exception as error:
            if not outages.is_outage(error):
                raise
            await self._close_for_outage()

    async def _answer(self, content) -> None:
        kind = content.get("type") if isinstance(content, dict) else None
        if kind == "watch":
            await self._watch(content.get("topics"))
            return
        if kind != "ping":
            error = 'expected {"type": "ping"} or {"type": "watch", "topics": [...]}'
            await self.send_json({"type": "error", "error": error})
            return
        await self.channel_layer.send(
            self.channel_name,
            {
                "type": "clock.echo",
                "client_sent": content.get("sent"),
                "layer_sent": time.monotonic(),
            },
        )

    async def _watch(self, topics) -> None:
        valid = isinstance(topics, list) and len(topics) <= MAX_TOPICS
        if not valid or not all(isinstance(t, str) and TOPIC.match(t) for t in topics):
            error = (
                f"topics: a list of at most {MAX_TOPICS} of 'fleet', 'tree', 'events', "
                "'reports', 'client.ID', 'event.UUID' or 'report.ID'"
            )
            await self.send_json({"type": "error", "error": error})
            return
        if not await _may_read(self.scope["user"]):
            await self.send_json({"type": "error", "error": "your role cannot read the fleet"})
            return
        for topic in topics:
            await self.channel_layer.group_add(console_group(topic), self.channel_name)
        self.watching = set(topics) | getattr(self, "watching", set())
        await self.send_json({"type": "watching", "topics": topics})

    async def console_changed(self, message: dict) -> None:
        """An announcement of a watched topic."""
        await self.send_json({"type": "changed", "topic": message["topic"]})

    async def clock_echo(self, message: dict) -> None:
        """Handle the message that made the round trip through the channel layer."""
        layer_ms = (time.monotonic() - message["layer_sent"]) * 1000
        await self.send_json(
            {
                "type": "time",
                "server_time": datetime.now(UTC).isoformat(timespec="milliseconds"),
                "client_sent": message.get("client_sent"),
                "layer_ms": round(layer_ms, 2),
            }
        )


@database_sync_to_async
def _may_read(user) -> bool:
    return user.has_perm(READ)


@database_sync_to_async
def _lacks_second_factor(scope) -> bool:
    """Whether the socket's session belongs to a role that must prove a second factor
    and has not (console.middleware.RequireSecondFactor, for pages)."""
    session = scope.get("session") or {}
    return needs_second_factor(scope["user"]) and DEVICE_ID_SESSION_KEY not in session
