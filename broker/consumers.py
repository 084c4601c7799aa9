"""The agents' WebSocket endpoint: protocol version 1, documented in docs/protocol.md.

One connection is one client session. Nothing but `login` is accepted until a token
has been checked; after that the connection joins the channel-layer group of that
client, and only that one, so it receives exactly that client's deliveries.

Live pushes, and the end of a session, reach the socket through the process's local
fan-out (broker.push.layer): one task writes a push to all of the process's sockets, no
consumer is woken for it. They are held while a replay is being sent, so that a
replay is never interleaved with live notifications.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import sys
import threading
import time
from collections.abc import Coroutine
from datetime import UTC, datetime
from functools import partial
from typing import Any

import orjson
from asgiref.sync import SyncToAsync
from channels.consumer import get_handler_name
from channels.exceptions import StopConsumer
from channels.generic.websocket import AsyncWebsocketConsumer
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import close_old_connections, connections

from broker import handshake_denial, protocol
from broker.audit import Actor
from broker.errors import AuthenticationFailed, BrokerError, InvalidInput
from broker.group_commit import GroupCommit
from broker.protocol import Request
from broker.push import outages
from broker.push.to_agents import MESSAGE_TYPE as PUSH_TYPE
from broker.push.to_agents import SESSION_REVOKED, client_group
from broker.reads.deliveries import deliveries_to_replay, last_position_of
from broker.seals import SealCache, stored_seal
from broker.services import agents, presence
from broker.services.clients import StatedValues
from broker.services.deliveries import (
    Answer,
    Confirmation,
    acknowledge_deliveries,
    confirm_receipts,
)
from broker.services.events import sender_signature

# How often a thread of the pool checks its database connection (a round trip) before
# using it. Channels checks before every call: a second round trip for most requests.
CONNECTION_CHECK_EVERY_S = 1.0
_checked = threading.local()


class _DatabaseWork(SyncToAsync):
    """Channels' `database_sync_to_async`, checking connections at most once a second
    per thread instead of before every call: a connection that broke meanwhile fails
    one request (the agent retries it) and is dropped right after it."""

    def thread_handler(self, loop, *args, **kwargs):
        now = time.monotonic()
        if now - getattr(_checked, "at", -CONNECTION_CHECK_EVERY_S) >= CONNECTION_CHECK_EVERY_S:
            close_old_connections()
            _checked.at = now
        try:
            return super().thread_handler(loop, *args, **kwargs)
        finally:
            _drop_failed_connections()


def _drop_failed_connections() -> None:
    for connection in connections.all(initialized_only=True):
        if connection.errors_occurred or connection.in_atomic_block:
            connection.close_if_unusable_or_obsolete()


# Database work runs in a thread pool: Channels' default (one thread for every
# consumer of the process) would queue a whole fleet behind each query.
in_thread = partial(_DatabaseWork, thread_sensitive=False)
# The seals of recent events, for the live pushes of this process's sockets.
_seals = SealCache()


def _socket_closed_errors() -> tuple[type[BaseException], ...]:
    """What a send to a socket that is closing raises: the OSError that the ASGI
    specification asks of servers (Uvicorn's), and autobahn's own error when autobahn
    is there to raise it (Daphne imports it before the application). Not imported
    here: autobahn costs a web process 20 MB."""
    autobahn = sys.modules.get("autobahn.exception")
    return (OSError,) if autobahn is None else (OSError, autobahn.Disconnected)


SOCKET_CLOSED = _socket_closed_errors()
# The sessions' confirmations and answers, each kind run together (one statement for
# all that wait).
_confirmations = GroupCommit(in_thread(confirm_receipts), key=lambda c: c.client.pk)
_answers = GroupCommit(in_thread(acknowledge_deliveries), key=lambda a: a.delivery_id)
# And the agents' updates (a fleet reports its load every minute or so: gathered for
# AGENT_REPORTS_GATHER_MS, a few dozen a call at 10,000 agents instead of one), and their
# advertisements (a fleet logging in states its models at once).
REPORTS_GATHER_S = settings.AGENT_REPORTS_GATHER_MS / 1000
_updates = GroupCommit(
    in_thread(agents.updates), key=lambda s: s.client.pk, gather_s=REPORTS_GATHER_S
)
_advertisements = GroupCommit(in_thread(agents.advertisements), key=lambda s: s.client.pk)
# And their logins (a fleet logging in at once, after an outage: the tokens checked, the
# groups joined and the streams' ends read for all that wait, a statement or a round
# trip each), one per token.
_sessions = GroupCommit(
    in_thread(lambda logins: agents.start_sessions(logins, join=_join_groups)),
    key=lambda login: login.token,
)
# And their `received` frames, gathered too: an idle fleet's heartbeats (every agent
# every AGENT_HEARTBEAT_S) would otherwise run nearly one a statement, and the agent
# waits for the answer only to know that the connection lives. A confirmation in an
# answer (`ack`) runs at once: it marks deliveries received that a page is watching.
_heartbeats = GroupCommit(
    in_thread(confirm_receipts), key=lambda c: c.client.pk, gather_s=REPORTS_GATHER_S
)
# And their sessions' presence: logins, heartbeats, closes (a statement per kind).
_presence = GroupCommit(
    in_thread(presence.record), key=lambda c: c.client_id, gather_s=REPORTS_GATHER_S
)
logger = logging.getLogger(__name__)


async def _close_silent(session: AgentConsumer) -> None:
    await session.close(code=protocol.CLOSE_SILENT)


# The logged-in sessions of this process, closed when they go silent.
_silence = protocol.SilenceWatch(heartbeat_s=settings.AGENT_HEARTBEAT_S, close=_close_silent)


def _join_groups(memberships: list[tuple[str, str]]) -> None:
    """Join each (group, channel), in one round trip to Redis (from a worker thread)."""
    get_channel_layer().group_add_many_blocking(memberships)


# The connections of this process waiting to log in, at most AGENT_LOGINS_AT_ONCE.
_logins = protocol.LoginGate(
    settings.AGENT_LOGINS_AT_ONCE, patience_s=settings.AGENT_LOGIN_TIMEOUT_S / 2
)
handshake_denial.quiet_uvicorn_about_denials()
outages.quiet_uvicorn_about_outages()
# Tasks running in the background (presence writes, closes at the login time-out): kept
# here so that they are not collected before they finish (the event loop holds tasks
# only weakly).
_background: set[asyncio.Task] = set()


def _in_background(work: Coroutine) -> asyncio.Task:
    """Run `work` without waiting for it, held until it ends."""
    task = asyncio.create_task(work)
    _background.add(task)
    task.add_done_callback(_background.discard)
    return task


class SendsUntilClosed(AsyncWebsocketConsumer):
    """A consumer whose frames after it closed the socket, or after the peer went, are
    dropped rather than raised: frames read before a close are still answered, and a
    push may cross a close. Uvicorn raises `RuntimeError` on a send after the close
    (Daphne dropped it), and raising would end the consumer before its disconnect."""

    closed = False  # the close was sent, or the peer is gone

    async def send(self, text_data=None, bytes_data=None, close=False) -> None:
        if not self.closed:
            await self._unless_gone(super().send(text_data, bytes_data, close))

    async def close(self, code=None, reason=None) -> None:
        if not self.closed:
            self.closed = True
            await self._unless_gone(super().close(code=code, reason=reason))

    async def write(self, message: dict) -> None:
        """Send an ASGI message as it is, unless closed: the pushes' path, without
        Channels' checks of what `send` is given."""
        if not self.closed:
            await self._unless_gone(self.base_send(message))

    async def _unless_gone(self, sending) -> None:
        """Await `sending`; a socket found gone is closed for this consumer."""
        try:
            await sending
        except SOCKET_CLOSED:
            self.closed = True

    async def leave_groups(self, groups) -> None:
        """Leave the channel layer's `groups` as the socket ends; with a server down,
        the memberships are left to expire (the layer's group expiry) and the socket's
        end goes on."""
        try:
            for group in groups:
                await self.channel_layer.group_discard(group, self.channel_name)
        except Exception as error:
            if not outages.is_outage(error):
                raise
            logger.warning("could not leave %s as its socket ended", groups, exc_info=True)


class AgentConsumer(SendsUntilClosed):
    """A managed node's or controller's session."""

    async def __call__(self, scope, receive, send) -> None:
        """As Channels' consumer, but the session's channel-layer messages (its pushes
        and the end of its session) come through the process's local fan-out: no
        queue of its own and no task waiting on it, memory that counts at a fleet's
        size (broker.push.layer.local_channel). The socket's frames are read here."""
        self.scope, self.base_send = scope, send
        self.channel_layer = get_channel_layer(self.channel_layer_alias)
        self.channel_name = self.channel_layer.local_channel(
            {PUSH_TYPE: self._pushed, SESSION_REVOKED: self.session_revoked}
        )
        try:
            while True:
                await self.dispatch(await receive())
        except StopConsumer:
            pass
        finally:
            self.channel_layer.drop_local_channel(self.channel_name)

    async def connect(self) -> None:
        self.client = None
        self.actor: Actor | None = None
        self.group: str | None = None  # the client group joined, from the login on
        self.held_pushes: list[dict] | None = None  # while a replay is being sent
        self.bucket = protocol.TokenBucket()
        self.refused_frames = 0
        self.stalled: tuple[int, float] | None = None  # (confirmed position, since when)
        self.session_recorded = False
        self.last_presence_write: asyncio.Task | None = None
        self.seen_at = 0.0  # time.monotonic() of the last presence write
        self.heard_at = time.monotonic()  # of the last frame (broker.protocol.SilenceWatch)
        self.login_deadline: asyncio.TimerHandle | None = None
        self.waiting_to_log_in = False
        self.login_ticket: protocol.LoginTicket | None = None  # let in by the gate
        try:
            self.login_ticket = _logins.arrive()
        except protocol.Busy as busy:
            await self._refuse_busy(busy)
            return
        await self.accept()
        self.waiting_to_log_in = True
        # A timer, not a task: a task (with its sleeping coroutine, and once cancelled its
        # error and traceback) was kept by every socket for as long as it lived.
        self.login_deadline = asyncio.get_running_loop().call_later(
            settings.AGENT_LOGIN_TIMEOUT_S, self._close_unless_logged_in
        )

    async def _refuse_busy(self, busy: protocol.Busy) -> None:
        """Refuse the handshake itself where the web server can (503, Retry-After, the
        `busy` frame as the body): a crowd's refused agents no longer open a
        WebSocket to be told, in a frame, and closed, each side's work for every
        refusal; elsewhere (Daphne), accept, send the frame and close with 4503."""
        if not handshake_denial.can_deny(self.scope):
            await self.accept()
            await self._refuse(busy, None)
            return
        self.closed = True  # no WebSocket: nothing is sent on it
        retry_after = str(math.ceil(busy.retry_after_s)).encode()
        denial = handshake_denial.deny(
            self.base_send,
            status=503,
            headers=[(b"content-type", b"application/json"), (b"retry-after", retry_after)],
            body=_encoded(protocol.error_frame(busy)).encode(),
        )
        await self._unless_gone(denial)

    def _done_waiting(self, *, logged_in: bool) -> None:
        if self.waiting_to_log_in:
            self.waiting_to_log_in = False
            _logins.leave(self.login_ticket, logged_in=logged_in)

    async def websocket_disconnect(self, message: dict) -> None:
        """As Channels', without closing the database connections of the process's one
        shared sync thread, which this consumer never uses (its database work runs in
        `in_thread`, which closes its own): a turn on that thread for every socket that
        ends, all of the process's in one queue, was a sixteenth of a web process's
        time while a crowd was refused and logged in."""
        await self.disconnect(message["code"])
        raise StopConsumer()

    async def disconnect(self, code: int) -> None:
        self._done_waiting(logged_in=False)
        self._stop_login_deadline()
        _silence.forget(self)
        self.channel_layer.drop_local_channel(self.channel_name)
        if self.session_recorded:
            self._record_presence(presence.Kind.CLOSED)
        if self.group is not None:  # even after half a login
            await self.leave_groups([self.group])

    async def dispatch(self, message: dict) -> None:
        """As Channels' dispatch, without closing the database connections of its one
        shared sync thread before every frame: that is a round trip to that thread per
        frame, every consumer of the process in one queue, and this consumer's database
        work runs in `in_thread`, which closes its own connections."""
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None):
        self.heard_at = time.monotonic()
        try:
            request = self._admitted(text_data, bytes_data)
        except (protocol.TooLarge, protocol.RateLimited) as error:
            await self._refuse_abuse(error)
            return
        except BrokerError as error:
            await self._refuse(error, None)
            return
        except Exception:
            await self._refuse_after_failure(None)
            return
        if self.client is None and request.type != "login":
            error = AuthenticationFailed("log in first", field="type")
            await self._refuse(error, request.ref)
            return
        await self._answer(request)

    def _admitted(self, text: str | None, data: bytes | None) -> Request:
        if not self.bucket.allow():
            raise protocol.RateLimited(
                f"more than {protocol.RATE_PER_S:g} frames per second", field="frame"
            )
        return protocol.parse_frame(text, data)

    async def _answer(self, request: Request) -> None:
        handler = getattr(self, f"on_{request.type}")
        try:
            reply = await handler(request)
        except BrokerError as error:
            await self._refuse(_located(error, request.type), request.ref)
            return
        except Exception:
            await self._refuse_after_failure(request.ref)
            return
        if reply is not None:
            await self._send({**reply, "ref": request.ref})

    async def _refuse(self, error: BrokerError, ref: Any) -> None:
        """Say what was wrong; a client that has not logged in is disconnected (told
        to try again later when the console was busy, not that it was refused)."""
        await self._send(protocol.error_frame(error, ref))
        if self.client is None:
            busy = isinstance(error, protocol.Busy)
            await self.close(code=protocol.CLOSE_BUSY if busy else protocol.CLOSE_UNAUTHENTICATED)

    async def _refuse_after_failure(self, ref: Any) -> None:
        """The last line of defence: a failure while handling a frame is logged and
        answered, instead of closing the socket with 1011; the session goes on. (A
        Redis or PostgreSQL outage is logged once per process: broker.push.outages.)"""
        logger.exception("agent frame failed (client %s)", self.actor or "not logged in")
        server = outages.server_down(sys.exc_info()[1])
        said = f"the server cannot reach {server} now" if server else "the server failed"
        await self._send(protocol.error_frame(protocol.InternalError(said), ref))
        if self.client is None:  # not the token's fault: the agent may retry later
            await self.close(code=protocol.CLOSE_TRY_AGAIN_LATER)

    async def _refuse_abuse(self, error: BrokerError) -> None:
        self.refused_frames += 1
        await self._send(protocol.error_frame(error))
        if self.client is None or self.refused_frames >= protocol.ABUSE_LIMIT:
            await self.close(code=protocol.CLOSE_ABUSIVE)

    def _close_unless_logged_in(self) -> None:
        if self.client is None:
            _in_background(self.close(code=protocol.CLOSE_LOGIN_TIMEOUT))

    def _stop_login_deadline(self) -> None:
        if self.login_deadline is not None:
            self.login_deadline.cancel()
            self.login_deadline = None

    async def _send(self, frame: dict) -> None:
        await self.write({"type": "websocket.send", "text": _encoded(frame)})

    # Requests -----------------------------------------------------------------------

    async def on_login(self, request: Request) -> None:
        if self.client is not None:
            raise BrokerError("this connection is already logged in", field="type")
        if not self.waiting_to_log_in:  # refused as busy when it connected: closing
            return
        token = request.require("token", str, "a client token")
        after = _after_position(request, required=False)
        legacy_after = request.optional(
            "after", int, "a whole number, the last delivery id received", None
        )
        agent = protocol.agent_self(request)
        await self._log_in(request.ref, token, after, legacy_after, agent)

    async def _log_in(
        self,
        ref: Any,
        token: str,
        after: int | None,
        legacy_after: int | None,
        agent: protocol.AgentSelf,
    ) -> None:
        peer = "{}:{}".format(*(self.scope.get("client") or ("?", "?")))
        # From the join on, pushes come through the local fan-out and wait for the
        # replay. Half a login (say Redis failed to join the group) is no login: the
        # agent is told to try again later (1013), not left without its live stream.
        async with self._pushes_held():
            opened = await _sessions.submit(
                agents.Login(token, peer, after, legacy_after, joining=self._joining)
            )
            self.client, self.token = opened.client, token
            self.actor = Actor("client", self.client.name)
            try:
                await self._send(self._welcome(ref, opened.last_position))
                await self._replay(
                    opened.after_position, ref, opened.last_position, opened.first_page
                )
            except Exception:
                self.client = self.actor = None
                raise
        self._stop_login_deadline()
        self._done_waiting(logged_in=True)
        _silence.watch(self)
        self.session_recorded = True
        self._record_presence(presence.Kind.OPENED, peer=peer, agent=agent)

    def _joining(self, client_id: int) -> tuple[str, str]:
        """(the client's group, this session's channel), to join (from the logins'
        worker thread); the group is noted first, so that a close after half a login
        still leaves it."""
        self.group = client_group(client_id)
        return self.group, self.channel_name

    @contextlib.asynccontextmanager
    async def _pushes_held(self):
        """Hold live pushes while the body sends a replay, then send them (those the
        replay already sent come twice; the agent drops the repeats). A body that
        fails without a session drops them."""
        self.held_pushes = []
        try:
            yield
        finally:
            held, self.held_pushes = self.held_pushes, None
            if self.client is not None:
                for message in held:
                    await self._pushed(message)

    def _welcome(self, ref: Any, last_position: int) -> dict:
        return {
            "type": "welcome",
            "ref": ref,
            "protocol": protocol.PROTOCOL_VERSION,
            "client": self.client.name,
            "model": self.client.model.name,
            "last_position": last_position,
            "heartbeat_s": settings.AGENT_HEARTBEAT_S,
            "limits": {
                "max_frame_bytes": protocol.MAX_FRAME_BYTES,
                "frames_per_s": protocol.RATE_PER_S,
                "burst": protocol.BURST,
            },
        }

    async def _replay(
        self,
        after: int | None,
        ref: Any,
        through: int | None = None,
        first_page: list[dict] | None = None,
    ) -> None:
        """Send what the client missed, in position order, up to the stream's end as
        it is now (or `through`, with `first_page` already read); then say how far
        that went (positions up to it that were not sent are gone: expired or,
        without a cursor, answered). Live pushes follow."""
        if through is None:
            through = await in_thread(last_position_of)(self.client)
        cursor, count, items = after or 0, 0, first_page
        while cursor < through:
            if items is None:
                items = await in_thread(deliveries_to_replay)(
                    self.client,
                    after_position=cursor,
                    through=through,
                    unanswered_only=after is None,
                    limit=protocol.REPLAY_PAGE,
                )
            for item in items:
                await self._notify(item, replay=True)
            count += len(items)
            if len(items) < protocol.REPLAY_PAGE:
                break
            cursor, items = items[-1]["position"], None
        await self._send({"type": "replayed", "ref": ref, "count": count, "through": through})

    async def on_advertise(self, request: Request) -> dict:
        values = request.require("values", dict, "an object of attribute values")
        await _advertisements.submit(StatedValues(self.client, values, self.actor))
        return {"type": "ok"}

    async def on_update(self, request: Request) -> dict:
        values = request.require("values", dict, "an object of attribute values")
        await _updates.submit(StatedValues(self.client, values, self.actor))
        return {"type": "ok"}

    async def on_policy(self, request: Request) -> dict:
        text = request.require("text", str, "the policy's text")
        version = await in_thread(agents.set_agent_policy)(
            client=self.client, text=text, actor=self.actor
        )
        return {"type": "ok", "policy_version": version}

    async def on_publish(self, request: Request) -> dict:
        event = await in_thread(agents.publish)(
            client=self.client,
            content=request.require("content", dict, "an object of attributes"),
            selector=request.optional("selector", str, "a selector's text", ""),
            lifetime_s=request.optional("lifetime_s", int, "whole seconds", 60),
            channel=request.optional("channel", str, "a channel name", "default"),
            idempotency_key=request.optional(
                "idempotency_key", str, "a key of at most 128 characters", None
            ),
            actor=self.actor,
            signed=sender_signature(
                event_id=request.optional("id", str, "the event's UUID", None),
                signed_at=request.optional("signed_at", int, "whole Unix seconds", None),
                signature=request.optional("signature", str, "a signature in base64", None),
            ),
        )
        return {"type": "published", **event}

    async def on_ack(self, request: Request) -> dict | None:
        answer = Answer(
            client=self.client,
            delivery_id=request.require("delivery", int, "a delivery id"),
            status=request.require("status", str, '"ok" or "failed"'),
            result=request.optional("result", dict, "an object", None),
            actor=self.actor,
        )
        # An answer may also confirm what the agent has (`position`): the confirmation
        # it would otherwise send a moment later, two frames and a request fewer.
        position = _position(request, required=False)
        await _answers.submit(answer)
        if position is None:
            return {"type": "ok"}
        return await self._confirmed(position, _confirmations)

    async def on_received(self, request: Request) -> dict | None:
        return await self._confirmed(_position(request, required=True), _heartbeats)

    async def _confirmed(self, position: int, group: GroupCommit) -> dict | None:
        """Record, with the others `group` runs together, that the agent has every
        delivery up to `position`; the answer says how far its stream goes (None: the
        session ended, its tokens were revoked)."""
        self._seen()
        # The confirmation is also the heartbeat: the token is checked again, so that a
        # revocation whose notice was lost (Redis down) still ends the session. (A Redis
        # that restarted and forgot the group: the process joins it again, push.layer.)
        confirmation = Confirmation(self.client, position, self.actor, self.token)
        stream = await group.submit(confirmation)
        if stream is None:
            await self.session_revoked({})
            return None
        if self._stalled_long(stream.confirmed_position, stream.last_position):
            # An agent that confirms but does not ask again for what it lacks (or whose
            # request was lost) is sent it anyway.
            async with self._pushes_held():
                await self._replay(stream.confirmed_position, None)
        return {
            "type": "ok",
            "last_position": stream.last_position,
            "confirmed_position": stream.confirmed_position,
        }

    def _stalled_long(self, confirmed: int, last: int) -> bool:
        """True when the agent has confirmed the same position, short of the stream's
        end, for REDELIVER_AFTER_S (then the clock starts again)."""
        now = time.monotonic()
        if confirmed >= last:
            self.stalled = None
            return False
        if self.stalled is None or self.stalled[0] != confirmed:
            self.stalled = (confirmed, now)
            return False
        if now - self.stalled[1] < settings.AGENT_REDELIVER_AFTER_S:
            return False
        self.stalled = (confirmed, now)
        return True

    async def on_resend(self, request: Request) -> None:
        after = _after_position(request, required=True)
        async with self._pushes_held():
            await self._replay(after, request.ref)

    async def on_heartbeat(self, request: Request) -> dict:
        self._seen()
        now = datetime.now(UTC).isoformat(timespec="milliseconds")
        return {"type": "heartbeat", "server_time": now}

    # Presence (broker.services.presence) ------------------------------------------------

    def _seen(self) -> None:
        """Heard from the agent: written at most every PRESENCE_REFRESH_S per session
        (the service also skips rows another session refreshed)."""
        if time.monotonic() - self.seen_at >= settings.PRESENCE_REFRESH_S:
            self._record_presence(presence.Kind.SEEN)

    def _record_presence(
        self, kind: presence.Kind, *, peer: str = "", agent=protocol.UNKNOWN_AGENT
    ) -> None:
        """Record a change of this session in the background, after its previous one
        (so a close never overtakes its open), with the other sessions' changes that
        wait. A failure is logged: the session neither waits for its presence nor ends
        because of it."""
        self.seen_at = time.monotonic()
        previous, client_id = self.last_presence_write, self.client.id

        async def run() -> None:
            if previous is not None:
                await previous
            try:
                await _presence.submit(presence.PresenceChange(client_id, kind, peer, agent))
            except Exception:
                logger.exception("recording the presence of client %s failed", client_id)

        self.last_presence_write = _in_background(run())

    # Channel-layer messages ---------------------------------------------------------

    async def _pushed(self, message: dict) -> None:
        # Sent as they come: a push that crosses a replay arrives twice, and the agent
        # drops the repeat by its position (docs/protocol.md, "The delivery contract").
        if self.held_pushes is not None:
            self.held_pushes.append(message)
            return
        if self.client is None:  # not (or no longer) logged in
            return
        for item in message["groups"].get(self.group, ()):
            await self._notify(item, replay=False)

    async def session_revoked(self, message: dict) -> None:
        """The client's tokens were revoked: the session ends now."""
        await self._send({"type": "error", "ref": None, **_revoked()})
        await self.close(code=protocol.CLOSE_REVOKED)

    async def _notify(self, item: dict, *, replay: bool) -> None:
        if "seal" not in item:  # a live push: the seal is read here, once per event
            item = {**item, "seal": await _seals.seal_of(item["event"], in_thread(stored_seal))}
        await self._send({"type": "notification", **item, "replay": replay})


def _encoded(frame: dict) -> str:
    """The frame as compact JSON text: orjson, several times faster than the standard
    library, for the pushes to thousands of sockets; the standard library for what
    orjson refuses (an integer `ref` beyond 64 bits)."""
    try:
        return orjson.dumps(frame).decode()
    except TypeError:
        return json.dumps(frame, separators=(",", ":"))


def _position(request: Request, *, required: bool, field: str = "position") -> int | None:
    """The last position the agent has: up to which `received` and `ack` confirm it has
    every delivery (`position`), or after which `login` and `resend` ask for more."""
    what = "a whole number, the last position the agent has"
    if required:
        return request.require(field, int, what)
    return request.optional(field, int, what, None)


def _after_position(request: Request, *, required: bool) -> int | None:
    """`login`'s and `resend`'s `after_position`: 0 or more."""
    after = _position(request, required=required, field="after_position")
    if after is not None and after < 0:
        raise InvalidInput("after_position must be 0 or more", field="after_position")
    return after


def _revoked() -> dict:
    return AuthenticationFailed("this client's tokens were revoked").as_dict()


def _located(error: BrokerError, request_type: str) -> BrokerError:
    """Name fields as they are spelled in the frame: attribute `load` is `values.load`."""
    field = error.field or ""
    if request_type in {"advertise", "update"} and field and not field.startswith("values"):
        error.field = f"values.{field}"
    return error
