"""The light fleet's WebSocket client against a real WebSocket server (websockets'): the
handshake, text frames of every length encoding both ways, fragments, pings, closes and
a refused handshake."""

from __future__ import annotations

import asyncio

import orjson
import pytest
import uvloop
from websockets.asyncio.server import serve
from websockets.datastructures import Headers
from websockets.http11 import Response

from demo.light_socket import Refused, open_socket

TIMEOUT_S = 5.0


def run(scene, handler, **options):
    """Run `scene(url)` against a server answering every connection with `handler`."""

    async def main():
        async with serve(handler, "127.0.0.1", 0, compression=None, **options) as server:
            port = server.sockets[0].getsockname()[1]
            async with asyncio.timeout(TIMEOUT_S):
                return await scene(f"ws://127.0.0.1:{port}/ws/agent/v1/")

    return main


def on_uvloop(main):
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main())


async def messages(socket, count: int) -> list[str]:
    """The first `count` messages the socket receives (those before, too)."""
    got, enough = [], asyncio.get_running_loop().create_future()

    def take(text: str) -> None:
        got.append(text)
        if len(got) == count:
            enough.set_result(None)

    socket.on_message = take
    await enough
    return got


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_text_frames_of_every_length_encoding_go_both_ways(loop):
    sizes = (5, 200, 70_000)  # a 7-bit, a 16-bit and a 64-bit payload length

    async def echo(connection):
        await connection.send("hello")  # before the client has said anything
        async for text in connection:
            await connection.send(text)

    async def scene(url):
        socket = await open_socket(url, timeout_s=TIMEOUT_S)
        sent = ["é" + "x" * (size - 2) for size in sizes]  # `size` bytes in UTF-8
        for text in sent:
            socket.send(text)
        assert await messages(socket, 4) == ["hello", *sent]
        socket.close()
        assert await socket.closed == 1000

    main = run(scene, echo)
    asyncio.run(main()) if loop == "asyncio" else on_uvloop(main)


def test_a_fragmented_message_is_reassembled():
    async def fragments(connection):
        await connection.send(["one ", "two ", "three"])
        await connection.send("after")
        await connection.wait_closed()

    async def scene(url):
        socket = await open_socket(url, timeout_s=TIMEOUT_S)
        assert await messages(socket, 2) == ["one two three", "after"]

    asyncio.run(run(scene, fragments)())


def test_a_ping_is_answered():
    async def ping(connection):
        pong = await connection.ping(b"are you there")
        await pong
        await connection.send("ponged")
        await connection.wait_closed()

    async def scene(url):
        socket = await open_socket(url, timeout_s=TIMEOUT_S)
        assert await messages(socket, 1) == ["ponged"]

    asyncio.run(run(scene, ping)())


def test_the_servers_close_code_is_kept_and_echoed():
    echoed = []

    async def revoke(connection):
        await connection.close(4403, "revoked")
        echoed.append(connection.protocol.close_rcvd.code)

    async def scene(url):
        socket = await open_socket(url, timeout_s=TIMEOUT_S)
        assert await socket.closed == 4403
        assert socket.close_code == 4403 and socket.closed.done()

    asyncio.run(run(scene, revoke)())
    assert echoed == [4403]


def test_a_connection_lost_without_a_close_is_1006():
    async def drop(connection):
        connection.transport.abort()

    async def scene(url):
        socket = await open_socket(url, timeout_s=TIMEOUT_S)
        assert await socket.closed == 1006

    asyncio.run(run(scene, drop)())


def test_a_busy_refusal_of_the_handshake_is_refused_with_its_status_headers_and_body():
    body = orjson.dumps({"type": "error", "code": "busy", "retry_after_s": 2.5})

    def busy(connection, request):
        headers = Headers(
            [("Content-Type", "application/json"), ("Retry-After", "3"),
             ("Content-Length", str(len(body)))]
        )  # fmt: skip
        return Response(503, "Service Unavailable", headers, body)

    async def scene(url):
        with pytest.raises(Refused) as refused:
            await open_socket(url, timeout_s=TIMEOUT_S)
        return refused.value

    refused = asyncio.run(run(scene, echo_nothing, process_request=busy)())
    assert refused.status == 503 and refused.headers["retry-after"] == "3"
    assert orjson.loads(refused.body) == orjson.loads(body)


async def echo_nothing(connection):
    await connection.wait_closed()


def test_wss_is_refused():
    with pytest.raises(ValueError, match="wss://"):
        asyncio.run(open_socket("wss://127.0.0.1:1/ws/agent/v1/", timeout_s=1))
