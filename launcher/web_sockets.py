"""The web server's WebSocket protocol: Uvicorn's (its sans-I/O one, on the websockets
library), forgetting the opening handshake once the socket is open.

Uvicorn keeps the handshake's request and response for a socket's whole life (the
request's headers twice over: the websockets parser's suspended frame holds the
request, and the ASGI scope a copy of its headers); nothing reads them once the
application has accepted. A web process holds thousands of agent sockets for days:
forgetting them took a socket from 17.9 to 13.2 KB in a bare Uvicorn (2,000 sockets;
docs/benchmarks.md)."""

from __future__ import annotations

from typing import Any

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol


class HandshakeForgettingProtocol(WebSocketsSansIOProtocol):
    """`--ws launcher.web_sockets:HandshakeForgettingProtocol`."""

    def handle_connect(self, event: Any) -> None:
        super().handle_connect(event)
        # The scope has its own copy now; the parser's frame keeps the request object.
        event.headers.clear()

    async def send(self, message: Any) -> None:
        await super().send(message)
        if message["type"] == "websocket.accept" and self.handshake_complete:
            # Every middleware and consumer read the headers when the socket opened.
            self.response = None
            self.scope["headers"].clear()
