"""The web server's WebSocket protocol forgets a socket's handshake once it is open."""

import asyncio

from uvicorn.config import Config
from uvicorn.server import ServerState
from websockets.client import ClientProtocol
from websockets.uri import parse_uri

from launcher.web_sockets import HandshakeForgettingProtocol


class Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()

    def get_extra_info(self, name, default=None):
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 50000)}.get(name)

    def write(self, data) -> None:
        self.written += data

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass


def test_an_open_socket_keeps_neither_the_request_nor_the_response_of_its_handshake():
    async def scenario():
        read_at_connect = []

        async def app(scope, receive, send):
            await receive()
            read_at_connect.append({k.lower(): v for k, v in scope["headers"]}.get(b"user-agent"))
            await send({"type": "websocket.accept"})
            await receive()

        config = Config(app=app, ws="launcher.web_sockets:HandshakeForgettingProtocol")
        config.load()
        server = HandshakeForgettingProtocol(config, ServerState(), {})
        server.connection_made(Transport())
        client = ClientProtocol(parse_uri("ws://127.0.0.1:8000/ws/agent/v1/"))
        request = client.connect()
        request.headers["User-Agent"] = "sn-agent 0.2.0"
        client.send_request(request)
        server.data_received(b"".join(client.data_to_send()))
        await asyncio.sleep(0.1)
        server.connection_lost(None)  # the application ends
        await asyncio.sleep(0)
        return read_at_connect, server

    read_at_connect, server = asyncio.run(scenario())
    assert read_at_connect == [b"sn-agent 0.2.0"]
    assert server.handshake_complete and server.transport.written.startswith(b"HTTP/1.1 101")
    assert server.response is None and server.scope["headers"] == []
