"""WebSocket consumers of the operators' console."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from channels.generic.websocket import AsyncJsonWebsocketConsumer

# Close code for an unauthenticated socket (4000-4999 are free for applications).
CLOSE_UNAUTHENTICATED = 4401


class ServerTimeConsumer(AsyncJsonWebsocketConsumer):
    """Echo the server's time for each ping, by way of the Redis channel layer.

    The reply is not written straight back: it is sent to this consumer's own channel
    and only written to the socket when it comes back, so every echo proves that the
    channel layer (Redis) works end to end.
    """

    async def connect(self) -> None:
        user = self.scope.get("user")
        # Accept first, then close with our code: a refused handshake would only show
        # the browser a bare failure, while a close code tells the client why.
        await self.accept()
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)

    async def receive_json(self, content, **kwargs) -> None:
        if not isinstance(content, dict) or content.get("type") != "ping":
            await self.send_json({"type": "error", "error": 'expected {"type": "ping"}'})
            return
        await self.channel_layer.send(
            self.channel_name,
            {
                "type": "clock.echo",
                "client_sent": content.get("sent"),
                "layer_sent": time.monotonic(),
            },
        )

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
