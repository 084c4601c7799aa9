"""The agents' WebSocket endpoint: protocol version 1, documented in docs/protocol.md.

One connection is one client session. Nothing but `login` is accepted until a token
has been checked; after that the connection joins the channel-layer group of that
client, and only that one, so it receives exactly that client's deliveries.
"""

from __future__ import annotations

import asyncio
import json
import logging
from datetime import UTC, datetime
from functools import partial
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings

from broker import protocol
from broker.audit import Actor
from broker.errors import AuthenticationFailed, BrokerError
from broker.notify import client_group
from broker.protocol import Request
from broker.selectors import deliveries_to_replay
from broker.services import agents

# Database work runs in a thread pool: Channels' default (one thread for every
# consumer of the process) would queue a whole fleet behind each query.
in_thread = partial(database_sync_to_async, thread_sensitive=False)
logger = logging.getLogger(__name__)


class AgentConsumer(AsyncWebsocketConsumer):
    """A managed node's or controller's session."""

    async def connect(self) -> None:
        self.client = None
        self.actor: Actor | None = None
        self.bucket = protocol.TokenBucket()
        self.refused_frames = 0
        self.last_sent = 0  # the highest delivery id written to this socket
        await self.accept()
        self.login_deadline = asyncio.create_task(self._close_unless_logged_in())

    async def disconnect(self, code: int) -> None:
        self.login_deadline.cancel()
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
        after = request.optional("after", int, "the last delivery id received", None)
        peer = "{}:{}".format(*(self.scope.get("client") or ("?", "?")))
        self.client = await in_thread(agents.authenticate_agent)(token=token, peer=peer)
        self.actor = Actor("client", self.client.name)
        self.login_deadline.cancel()
        # Join before reading what is pending, so that nothing falls in between.
        await self.channel_layer.group_add(client_group(self.client.id), self.channel_name)
        await self._send(self._welcome(request.ref))
        await self._replay(after, request.ref)

    def _welcome(self, ref: Any) -> dict:
        return {
            "type": "welcome",
            "ref": ref,
            "protocol": protocol.PROTOCOL_VERSION,
            "client": self.client.name,
            "model": self.client.model.name,
            "heartbeat_s": protocol.HEARTBEAT_S,
            "limits": {
                "max_frame_bytes": protocol.MAX_FRAME_BYTES,
                "frames_per_s": protocol.RATE_PER_S,
                "burst": protocol.BURST,
            },
        }

    async def _replay(self, after: int | None, ref: Any) -> None:
        """Send what the client missed, oldest first, then tell it the live stream starts."""
        cursor, count = after or 0, 0
        while True:
            items = await in_thread(deliveries_to_replay)(
                self.client, after=cursor, unanswered_only=after is None, limit=protocol.REPLAY_PAGE
            )
            for item in items:
                count += await self._notify(item, replay=True)
            if len(items) < protocol.REPLAY_PAGE:
                break
            cursor = items[-1]["delivery"]
        await self._send(
            {"type": "replayed", "ref": ref, "count": count, "last_delivery": self.last_sent}
        )

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

    async def on_heartbeat(self, request: Request) -> dict:
        now = datetime.now(UTC).isoformat(timespec="milliseconds")
        return {"type": "heartbeat", "server_time": now}

    # Channel-layer messages ---------------------------------------------------------

    async def deliveries_push(self, message: dict) -> None:
        """New deliveries of this client, pushed by its leaf after they committed."""
        for item in message["groups"].get(client_group(self.client.id), []):
            await self._notify(item, replay=False)

    async def session_revoked(self, message: dict) -> None:
        """The client's tokens were revoked: the session ends now."""
        await self._send({"type": "error", "ref": None, **_revoked()})
        await self.close(code=protocol.CLOSE_REVOKED)

    async def _notify(self, item: dict, *, replay: bool) -> int:
        # A delivery both replayed and pushed live is written once.
        if item["delivery"] <= self.last_sent:
            return 0
        self.last_sent = item["delivery"]
        await self._send({"type": "notification", **item, "replay": replay})
        return 1


def _revoked() -> dict:
    return AuthenticationFailed("this client's tokens were revoked").as_dict()


def _located(error: BrokerError, request_type: str) -> BrokerError:
    """Name fields as they are spelled in the frame: attribute `load` is `values.load`."""
    field = error.field or ""
    if request_type in {"advertise", "update"} and field and not field.startswith("values"):
        error.field = f"values.{field}"
    return error
