"""Answering a WebSocket handshake with a plain HTTP response instead of opening the
socket (the ASGI `websocket.http.response` extension): what a busy console does with
the connections it cannot log in now.

Uvicorn (0.54, its websockets-sansio protocol) logs "ASGI callable returned without
completing handshake." at ERROR after every such answer, as if the application had
failed: it never marks a denied handshake complete. `deny` marks the connection's task
instead, and a filter on Uvicorn's logger drops that one line for the handshakes denied
here, and only for them: the line is logged in the connection's own task, as the
application returns."""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Awaitable, Callable

EXTENSION = "websocket.http.response"
INCOMPLETE_HANDSHAKE = "ASGI callable returned without completing handshake."

_denied_here: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "handshake_denied_here", default=False
)


def can_deny(scope: dict) -> bool:
    """Whether the web server can answer this handshake with an HTTP response
    (Uvicorn can; Daphne cannot)."""
    return EXTENSION in scope.get("extensions", {})


async def deny(
    send: Callable[[dict], Awaitable[None]],
    *,
    status: int,
    headers: list[tuple[bytes, bytes]],
    body: bytes,
) -> None:
    """Answer the handshake with `status`, `headers` and `body`; no WebSocket opens."""
    _denied_here.set(True)
    await send({"type": f"{EXTENSION}.start", "status": status, "headers": headers})
    await send({"type": f"{EXTENSION}.body", "body": body})


class _NoErrorForDeniedHandshakes(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not (_denied_here.get() and record.getMessage() == INCOMPLETE_HANDSHAKE)


def quiet_uvicorn_about_denials() -> None:
    """Install the filter on Uvicorn's logger (once)."""
    uvicorn_errors = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, _NoErrorForDeniedHandshakes) for f in uvicorn_errors.filters):
        uvicorn_errors.addFilter(_NoErrorForDeniedHandshakes())
