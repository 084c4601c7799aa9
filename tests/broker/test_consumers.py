"""The agent consumer run in this process (the real Redis channel layer, no web
server): what a socket costs the web process beyond its frames, and how a busy process
refuses one where its web server cannot refuse the handshake itself."""

from __future__ import annotations

import asyncio
import json
import logging
import math

import channels.generic.websocket
import pytest
from channels.testing import WebsocketCommunicator

from broker import consumers, handshake_denial, protocol
from broker.consumers import AgentConsumer

PATH = "/ws/agent/v1/"


@pytest.fixture
def shared_sync_thread_turns(monkeypatch) -> list[str]:
    """The turns a consumer takes on the process's one shared sync thread to close
    that thread's database connections (Channels does at every disconnect)."""
    turns: list[str] = []

    async def close_old_connections() -> None:
        turns.append("close_old_connections")

    monkeypatch.setattr(channels.generic.websocket, "aclose_old_connections", close_old_connections)
    return turns


@pytest.fixture
def nobody_let_in(monkeypatch) -> None:
    """A process whose gate refuses every connection as busy."""
    monkeypatch.setattr(consumers, "_logins", protocol.LoginGate(0))


def test_an_agent_socket_that_ends_takes_no_turn_on_the_shared_sync_thread(
    shared_sync_thread_turns,
):
    async def open_and_close() -> None:
        communicator = WebsocketCommunicator(AgentConsumer.as_asgi(), PATH)
        connected, _ = await communicator.connect(timeout=5)
        assert connected
        await communicator.disconnect(timeout=5)

    asyncio.run(open_and_close())
    assert shared_sync_thread_turns == []


def test_where_the_server_cannot_refuse_a_handshake_a_busy_process_says_so_and_closes_4503(
    nobody_let_in,
):
    async def refused() -> tuple[dict, dict]:
        communicator = WebsocketCommunicator(AgentConsumer.as_asgi(), PATH)  # no extension
        connected, _ = await communicator.connect(timeout=5)
        assert connected
        frame = await communicator.receive_json_from(timeout=5)
        return frame, await communicator.receive_output(timeout=5)

    frame, close = asyncio.run(refused())
    assert frame["code"] == "busy" and frame["retry_after_s"] >= 1.0
    assert close == {"type": "websocket.close", "code": protocol.CLOSE_BUSY}


class DenyingServer:
    """Runs the consumer as Uvicorn does, in the connection's task, and logs what
    Uvicorn 0.54 logs when the application returns from a handshake it answered with
    an HTTP response."""

    def __init__(self) -> None:
        self.sent: list[dict] = []

    async def serve(self) -> None:
        inbox = asyncio.Queue()
        inbox.put_nowait({"type": "websocket.connect"})
        scope = {"type": "websocket", "path": PATH, "headers": [], "query_string": b""}
        scope["extensions"] = {handshake_denial.EXTENSION: {}}

        async def send(message: dict) -> None:
            self.sent.append(message)
            if message["type"].endswith(".body"):
                inbox.put_nowait({"type": "websocket.disconnect", "code": 1006})

        await AgentConsumer.as_asgi()(scope, inbox.get, send)
        logging.getLogger("uvicorn.error").error(handshake_denial.INCOMPLETE_HANDSHAKE)


def test_a_busy_process_refuses_the_handshake_503_and_uvicorn_does_not_call_it_an_error(
    nobody_let_in, caplog
):
    server = DenyingServer()
    asyncio.run(server.serve())
    start, body = server.sent
    frame = json.loads(body["body"])
    assert start["status"] == 503 and frame["code"] == "busy"
    assert (b"retry-after", str(math.ceil(frame["retry_after_s"])).encode()) in start["headers"]
    assert handshake_denial.INCOMPLETE_HANDSHAKE not in caplog.text
    # Elsewhere (an application that really returned without answering), it still is.
    logging.getLogger("uvicorn.error").error(handshake_denial.INCOMPLETE_HANDSHAKE)
    assert handshake_denial.INCOMPLETE_HANDSHAKE in caplog.text
