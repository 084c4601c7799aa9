"""The agents' WebSocket endpoint: protocol version 1, documented in docs/protocol.md.

One connection is one client session. Nothing but `login` is accepted until a token
has been checked; after that the connection joins the channel-layer group of that
client, and only that one, so it receives exactly that client's deliveries.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from datetime import UTC, datetime
from functools import partial
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings

from broker import protocol
from broker.audit import Actor
from broker.errors import AuthenticationFailed, BrokerError, InvalidInput
from broker.notify import client_group
from broker.protocol import Request
from broker.selectors import (
    deliveries_to_replay,
    live_token,
    position_after_delivery,
    stream_of,
)
from broker.services import agents, presence

# Database work runs in a thread pool: Channels' default (one thread for every
# consumer of the process) would queue a whole fleet behind each query.
in_thread = partial(database_sync_to_async, thread_sensitive=False)
logger = logging.getLogger(__name__)
# Presence writes running in the background: kept here so that they are not collected
# before they finish (the event loop holds tasks only weakly).
_presence_writes: set[asyncio.Task] = set()


class AgentConsumer(AsyncWebsocketConsumer):
    """A managed node's or controller's session."""

    async def connect(self) -> None:
        self.client = None
        self.actor: Actor | None = None
        self.bucket = protocol.TokenBucket()
        self.refused_frames = 0
        self.stalled: tuple[int, float] | None = None  # (confirmed position, since when)
        self.session_recorded = False
        self.last_presence_write: asyncio.Task | None = None
        self.seen_at = 0.0  # time.monotonic() of the last presence write
        await self.accept()
        self.login_deadline = asyncio.create_task(self._close_unless_logged_in())

    async def disconnect(self, code: int) -> None:
        self.login_deadline.cancel()
        if self.session_recorded:
            self._record_presence(presence.session_closed)
        if self.client is not None:
            await self.channel_layer.group_discard(client_group(self.client.id), self.channel_name)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None):
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
        """Say what was wrong; a client that has not logged in is disconnected."""
        await self._send(protocol.error_frame(error, ref))
        if self.client is None:
            await self.close(code=protocol.CLOSE_UNAUTHENTICATED)

    async def _refuse_after_failure(self, ref: Any) -> None:
        """The last line of defence: a failure while handling a frame is logged and
        answered, instead of closing the socket with 1011; the session goes on."""
        logger.exception("agent frame failed (client %s)", self.actor or "not logged in")
        await self._send(protocol.error_frame(protocol.InternalError("the server failed"), ref))
        if self.client is None:  # not the token's fault: the agent may retry later
            await self.close(code=protocol.CLOSE_TRY_AGAIN_LATER)

    async def _refuse_abuse(self, error: BrokerError) -> None:
        self.refused_frames += 1
        await self._send(protocol.error_frame(error))
        if self.client is None or self.refused_frames >= protocol.ABUSE_LIMIT:
            await self.close(code=protocol.CLOSE_ABUSIVE)

    async def _close_unless_logged_in(self) -> None:
        await asyncio.sleep(settings.AGENT_LOGIN_TIMEOUT_S)
        if self.client is None:
            await self.close(code=protocol.CLOSE_LOGIN_TIMEOUT)

    async def _send(self, frame: dict) -> None:
        await self.send(text_data=json.dumps(frame, separators=(",", ":")))

    # Requests -----------------------------------------------------------------------

    async def on_login(self, request: Request) -> None:
        if self.client is not None:
            raise BrokerError("this connection is already logged in", field="type")
        token = request.require("token", str, "a client token")
        after = _after_position(request, required=False)
        legacy_after = request.optional(
            "after", int, "a whole number, the last delivery id received", None
        )
        peer = "{}:{}".format(*(self.scope.get("client") or ("?", "?")))
        self.client = await in_thread(agents.authenticate_agent)(token=token, peer=peer)
        self.actor = Actor("client", self.client.name)
        self.token = token
        try:
            await self._start_session(request.ref, after, legacy_after)
        except Exception:
            # Half a login (say Redis failed to join the group) is no login: the agent
            # is told to try again later (1013), not left without its live stream.
            self.client = self.actor = None
            raise
        self.login_deadline.cancel()
        self.session_recorded = True
        self._record_presence(presence.session_opened, peer=peer)

    async def _start_session(self, ref: Any, after: int | None, legacy_after: int | None):
        if after is None and legacy_after is not None:
            after = await in_thread(position_after_delivery)(self.client, legacy_after)
        # Join before reading what is pending, so that nothing falls in between.
        await self.channel_layer.group_add(client_group(self.client.id), self.channel_name)
        through = await in_thread(_last_position)(self.client)
        await self._send(self._welcome(ref, through))
        await self._replay(after, ref, through)

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

    async def _replay(self, after: int | None, ref: Any, through: int | None = None) -> None:
        """Send what the client missed, in position order, up to the stream's end as
        it is now; then say how far that went (positions up to it that were not sent
        are gone: expired or, without a cursor, answered). Live pushes follow."""
        if through is None:
            through = await in_thread(_last_position)(self.client)
        cursor, count = after or 0, 0
        while cursor < through:
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
            cursor = items[-1]["position"]
        await self._send({"type": "replayed", "ref": ref, "count": count, "through": through})

    async def on_advertise(self, request: Request) -> dict:
        values = request.require("values", dict, "an object of attribute values")
        await in_thread(agents.advertise)(client=self.client, values=values, actor=self.actor)
        return {"type": "ok"}

    async def on_update(self, request: Request) -> dict:
        values = request.require("values", dict, "an object of attribute values")
        await in_thread(agents.update)(client=self.client, values=values, actor=self.actor)
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
        )
        return {"type": "published", **event}

    async def on_ack(self, request: Request) -> dict:
        await in_thread(agents.acknowledge)(
            client=self.client,
            delivery_id=request.require("delivery", int, "a delivery id"),
            status=request.require("status", str, '"ok" or "failed"'),
            result=request.optional("result", dict, "an object", None),
            actor=self.actor,
        )
        return {"type": "ok"}

    async def on_received(self, request: Request) -> dict | None:
        self._seen()
        position = request.require(
            "position", int, "a whole number, the last position the agent has"
        )
        # The confirmation is also the heartbeat: the token is checked again, so that a
        # revocation whose notice was lost (Redis down) still ends the session.
        if await in_thread(live_token)(self.token) is None:
            await self.session_revoked({})
            return None
        stream = await in_thread(agents.confirm)(
            client=self.client, position=position, actor=self.actor
        )
        # Joined again at every confirmation (the agent's heartbeat): a Redis that
        # restarted has forgotten the group, and live pushes resume with this.
        await self.channel_layer.group_add(client_group(self.client.id), self.channel_name)
        if self._stalled_long(stream.confirmed_position, stream.last_position):
            # An agent that confirms but does not ask again for what it lacks (or whose
            # request was lost) is sent it anyway.
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
        await self._replay(_after_position(request, required=True), request.ref)

    async def on_heartbeat(self, request: Request) -> dict:
        self._seen()
        now = datetime.now(UTC).isoformat(timespec="milliseconds")
        return {"type": "heartbeat", "server_time": now}

    # Presence (broker.services.presence) ------------------------------------------------

    def _seen(self) -> None:
        """Heard from the agent: written at most every PRESENCE_REFRESH_S per session
        (the service also skips rows another session refreshed)."""
        if time.monotonic() - self.seen_at >= settings.PRESENCE_REFRESH_S:
            self._record_presence(presence.seen)

    def _record_presence(self, write, **arguments) -> None:
        """Run `write` for this client in the background, after this session's previous
        presence write (so a close never overtakes its open). A failure is logged: the
        session neither waits for its presence nor ends because of it."""
        self.seen_at = time.monotonic()
        previous, client_id = self.last_presence_write, self.client.id

        async def run() -> None:
            if previous is not None:
                await previous
            try:
                await in_thread(write)(client_id=client_id, **arguments)
            except Exception:
                logger.exception("recording the presence of client %s failed", client_id)

        task = self.last_presence_write = asyncio.create_task(run())
        _presence_writes.add(task)
        task.add_done_callback(_presence_writes.discard)

    # Channel-layer messages ---------------------------------------------------------

    async def deliveries_push(self, message: dict) -> None:
        """New deliveries of this client, pushed by its leaf after they committed."""
        # Sent as they come: a push that crosses a replay arrives twice, and the agent
        # drops the repeat by its position (docs/protocol.md, "The delivery contract").
        for item in message["groups"].get(client_group(self.client.id), []):
            await self._notify(item, replay=False)

    async def session_revoked(self, message: dict) -> None:
        """The client's tokens were revoked: the session ends now."""
        await self._send({"type": "error", "ref": None, **_revoked()})
        await self.close(code=protocol.CLOSE_REVOKED)

    async def _notify(self, item: dict, *, replay: bool) -> None:
        await self._send({"type": "notification", **item, "replay": replay})


def _after_position(request: Request, *, required: bool) -> int | None:
    """The last position the agent has, as `login` and `resend` give it."""
    what = "a whole number, the last position the agent has"
    if required:
        after = request.require("after_position", int, what)
    else:
        after = request.optional("after_position", int, what, None)
    if after is not None and after < 0:
        raise InvalidInput("after_position must be 0 or more", field="after_position")
    return after


def _last_position(client) -> int:
    return stream_of(client).last_position


def _revoked() -> dict:
    return AuthenticationFailed("this client's tokens were revoked").as_dict()


def _located(error: BrokerError, request_type: str) -> BrokerError:
    """Name fields as they are spelled in the frame: attribute `load` is `values.load`."""
    field = error.field or ""
    if request_type in {"advertise", "update"} and field and not field.startswith("values"):
        error.field = f"values.{field}"
    return error
