"""The console's WebSocket: the footer's server clock, and live updates of the pages."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from datetime import UTC, datetime
from importlib import import_module

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings
from django.contrib.auth import SESSION_KEY
from django_otp import DEVICE_ID_SESSION_KEY

from broker import protocol
from broker.consumers import SendsUntilClosed
from broker.push import outages
from broker.push.to_consoles import EVENTS, FLEET, REPORTS, TREE, console_group
from broker.roles import READ, needs_second_factor
from console import sessions
from console.sessions import SessionEnd, session_end

# Close code for an unauthenticated socket (4000-4999 are free for applications).
CLOSE_UNAUTHENTICATED = 4401
# Close code for a socket whose session ended (console/sessions.py): the page reloads,
# onto the login page that says why.
CLOSE_SESSION_ENDED = 4440
# The end of a session that is no longer stored (logged out, or renewed under a new key).
SESSION_GONE = SessionEnd("gone", 0.0)
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
            return
        end = await _session_end(self.scope)
        if end is not None and end.at <= sessions.now():
            await self.close(code=CLOSE_SESSION_ENDED)
        elif end is not None:
            self.session_clock = asyncio.create_task(self._close_at_end(end.at))

    async def _close_at_end(self, end_at: float | None) -> None:
        """Close the socket when its session ends (its idle limit or its lifetime).
        The user's requests may have moved the end on meanwhile: at each end the
        session is read again, and the socket waits for the new end if it moved."""
        try:
            while end_at is not None:
                await asyncio.sleep(max(0.0, end_at - sessions.now()))
                end_at = await self._close_if_ended()
        except Exception as error:
            if not outages.is_outage(error):
                logger.exception("a console socket's session clock failed")
            await self._close_for_outage()  # the page connects again, and is checked

    async def _close_if_ended(self) -> float | None:
        """Close the socket if its session has ended; else return when it ends as
        stored now (None: it has no end to wait for)."""
        end = await _stored_session_end(self.scope)
        if end is SESSION_GONE:
            await self.close(code=CLOSE_UNAUTHENTICATED)  # the page connects with its cookie
            return None
        if end is not None and end.at <= sessions.now():
            await self.close(code=CLOSE_SESSION_ENDED)
            return None
        return None if end is None else end.at

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
        if (clock := getattr(self, "session_clock", None)) is not None:
            clock.cancel()
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
        """Announcements of topics, as broker.push.to_consoles sends them: the topics of
        every group that this page's process has pages in, of which this page tells
        those it watches (or one topic alone, as an earlier version sends it during an
        upgrade)."""
        if "topic" in message:
            topics = [message["topic"]]
        else:
            topics = sorted(payload["topic"] for payload in message["groups"].values())
        watching = getattr(self, "watching", set())
        for topic in topics:
            if topic in watching:
                await self.send_json({"type": "changed", "topic": topic})

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


@database_sync_to_async
def _session_end(scope) -> SessionEnd | None:
    """When the socket's session ends, as it was when the socket connected."""
    return session_end(scope["session"], scope["user"])


@database_sync_to_async
def _stored_session_end(scope) -> SessionEnd | None:
    """When the socket's session ends, as stored now (its user's requests may have
    moved it on); SESSION_GONE if it is no longer the user's session."""
    key = scope["session"].session_key
    stored = import_module(settings.SESSION_ENGINE).SessionStore(key).load() if key else {}
    if stored.get(SESSION_KEY) != str(scope["user"].pk):
        return SESSION_GONE
    return session_end(stored, scope["user"])
