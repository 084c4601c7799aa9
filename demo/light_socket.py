"""The light fleet's WebSocket client: the least a simulated agent needs, on a plain
`asyncio.Protocol` (so on uvloop's loop too), and nothing a benchmark would pay for
without need.

    socket = await open_socket("ws://127.0.0.1:8000/ws/agent/v1/", timeout_s=60)
    socket.on_message = print  # called from data_received, for every text message
    socket.send('{"type": "login", ...}')  # no await: written at once
    code = await socket.closed  # the close code, once the connection has ended

Text messages only (a binary one closes with 1003), no extensions, no TLS, no pings of
its own (it answers the server's), frames of at most 1 MiB (closed with 1009). What
`websockets` spends per connection and per frame on what the light fleet never uses (a
task and a queue per connection, a generator per frame, a general handshake parser) was
most of the fleet's own CPU per login and per delivery: this client spends a callback.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import struct
from collections.abc import Callable
from urllib.parse import urlsplit

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"  # RFC 6455, 1.3
MAX_FRAME_BYTES = 2**20  # a frame, or a message of fragments, past it: closed with 1009
MAX_HEAD_BYTES = 2**16  # the handshake response's head
# The client masks every frame it sends, with a key of four zero bytes: masking with it
# is a no-op, so a frame is its header and the payload as it is. The server cannot tell
# a zero key from any other. RFC 6455 (10.3) wants a key the sender's code cannot
# predict, against a browser's script poisoning a proxy's cache with bytes of its
# choosing; a benchmark's simulator on loopback runs no such script through any proxy.
# A client frame's header, for a payload of up to 125 bytes, up to 65,535 (a 16-bit
# length) and longer (64-bit): the masking key, four zero bytes (4x), is its end.
SHORT_HEAD, MEDIUM_HEAD, LONG_HEAD = (struct.Struct(f"!BB{n}4x") for n in ("", "H", "Q"))

OP_CONTINUATION, OP_TEXT, OP_BINARY = 0x0, 0x1, 0x2
OP_CLOSE, OP_PING, OP_PONG = 0x8, 0x9, 0xA
NO_CODE, ABNORMAL = 1005, 1006  # RFC 6455, 7.4.1: never sent, only recorded
PROTOCOL_ERROR, UNSUPPORTED, NOT_UTF8, TOO_BIG, INTERNAL_ERROR = 1002, 1003, 1007, 1009, 1011


class HandshakeError(Exception):
    """The server's answer to the opening handshake was not a WebSocket's."""


class Refused(HandshakeError):
    """The server answered the handshake with an HTTP response of its own."""

    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        super().__init__(f"the server refused the WebSocket: HTTP {status}")
        self.status, self.headers, self.body = status, headers, body


async def open_socket(url: str, *, timeout_s: float) -> LightSocket:
    """Connect to a `ws://` URL and open a WebSocket on the connection, within
    `timeout_s` (else TimeoutError). Raises Refused for an answer other than 101,
    HandshakeError for a 101 that is not a WebSocket's, OSError if it cannot connect."""
    host, port, target = address(url)
    key = base64.b64encode(os.urandom(16))
    request = handshake_request(host, port, target, key)
    loop = asyncio.get_running_loop()
    transport = None
    try:
        async with asyncio.timeout(timeout_s):
            transport, socket = await loop.create_connection(
                lambda: LightSocket(loop, request, accept_for(key)), host, port
            )
            await socket.opened
    except BaseException:
        if transport is not None:
            transport.abort()
        raise
    return socket


def address(url: str) -> tuple[str, int, str]:
    """Host, port and request target of a `ws://` URL."""
    parts = urlsplit(url)
    if parts.scheme == "wss":
        raise ValueError(f"{url}: wss:// is not supported (no TLS in the light socket)")
    if parts.scheme != "ws" or not parts.hostname:
        raise ValueError(f"{url}: not a ws:// URL")
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return parts.hostname, parts.port or 80, target


def handshake_request(host: str, port: int, target: str, key: bytes) -> bytes:
    """The opening handshake's HTTP/1.1 request (RFC 6455, 4.1), with no extensions."""
    name = f"[{host}]" if ":" in host else host  # an IPv6 address
    authority = name if port == 80 else f"{name}:{port}"
    return (
        f"GET {target} HTTP/1.1\r\nHost: {authority}\r\nUpgrade: websocket\r\n"
        f"Connection: Upgrade\r\nSec-WebSocket-Key: {key.decode()}\r\n"
        "Sec-WebSocket-Version: 13\r\n\r\n"
    ).encode()


def accept_for(key: bytes) -> str:
    """The Sec-WebSocket-Accept a server answers `key` with."""
    return base64.b64encode(hashlib.sha1(key + GUID).digest()).decode()


def frame(opcode: int, payload: bytes) -> bytes:
    """A final, masked client frame (masked with a zero key: the payload as it is)."""
    length = len(payload)
    if length < 126:
        return SHORT_HEAD.pack(0x80 | opcode, 0x80 | length) + payload
    if length < 2**16:
        return MEDIUM_HEAD.pack(0x80 | opcode, 0x80 | 126, length) + payload
    return LONG_HEAD.pack(0x80 | opcode, 0x80 | 127, length) + payload


def head_of(data: bytes, at: int) -> tuple[int, int]:
    """The header's size and the payload's length of the frame at `at` in `data` (the
    length -1 while the header has not all come)."""
    available = len(data) - at
    if available < 2:
        return 2, -1
    length = data[at + 1] & 0x7F
    if length < 126:
        return 2, length
    head = 4 if length == 126 else 10
    if available < head:
        return head, -1
    return head, int.from_bytes(data[at + 2 : at + head], "big")


def parse_head(head: bytes) -> tuple[int, dict[str, str]]:
    """Status and headers (names lower-cased, repeats joined) of a response's head."""
    status_line, *lines = head.decode("latin-1").split("\r\n")
    version, _, rest = status_line.partition(" ")
    code = rest[:3]
    if not version.startswith("HTTP/1.") or not code.isdigit():
        raise HandshakeError(f"not an HTTP response: {status_line[:80]!r}")
    headers: dict[str, str] = {}
    for line in lines:
        name, colon, value = line.partition(":")
        if not colon:
            raise HandshakeError(f"not an HTTP header: {line[:80]!r}")
        name, value = name.strip().lower(), value.strip()
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    return int(code), headers


class LightSocket(asyncio.Protocol):
    """A client WebSocket for text messages: `on_message` is called with each, from
    `data_received`; `closed` is done (with the close code) once the connection ends;
    `close_code` is the code the server closed with (1005 for a close without a code,
    1006 for a connection lost without a close), or the one this side closed with."""

    def __init__(self, loop: asyncio.AbstractEventLoop, request: bytes, accept: str) -> None:
        self.opened: asyncio.Future[None] = loop.create_future()
        self.closed: asyncio.Future[int] = loop.create_future()
        self.close_code: int | None = None
        self.transport: asyncio.Transport | None = None
        self._request, self._accept = request, accept
        self._buffer = bytearray()
        self._need = 0  # bytes the buffer must hold before a frame can be complete
        self._parts: list[bytes] | None = None  # a fragmented message so far
        self._early: list[str] = []  # messages before on_message was set
        self._deliver: Callable[[str], None] = self._early.append
        self._closing = False

    @property
    def on_message(self) -> Callable[[str], None]:
        """Called with every text message as it arrives (set it once the socket is
        open: messages that came before are handed to it then)."""
        return self._deliver

    @on_message.setter
    def on_message(self, callback: Callable[[str], None]) -> None:
        self._deliver = callback
        early, self._early = self._early, []
        for text in early:
            callback(text)

    def send(self, text: str) -> None:
        """Send a text message (dropped once the socket is closing or closed)."""
        if not self._closing:
            self.transport.write(frame(OP_TEXT, text.encode()))

    def close(self, code: int = 1000) -> None:
        """Send a close frame with `code` and close the connection (if still open)."""
        if not self._closing and self.transport is not None:
            self._close(code)

    def _close(self, code: int, payload: bytes | None = None) -> None:
        """Send a close frame (`code`, unless `payload` says otherwise) and close."""
        self._closing = True
        if self.close_code is None:
            self.close_code = code
        if payload is None:
            payload = code.to_bytes(2, "big")
        self.transport.write(frame(OP_CLOSE, payload))
        self.transport.close()

    # asyncio.Protocol ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        transport.write(self._request)

    def data_received(self, data: bytes) -> None:
        if not self.opened.done():
            self._handshake(data)
            return
        buffer = self._buffer
        if buffer:
            buffer += data
            if len(buffer) < self._need:
                return
            data = bytes(buffer)
            buffer.clear()
        try:
            self._frames(data)
        except Exception as error:  # the owner's callback failed: it is told on closed
            self._fail(error)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        if self.close_code is None:
            self.close_code = ABNORMAL
        if not self.opened.done():
            lost = exc or ConnectionResetError("connection closed during the handshake")
            self.opened.set_exception(lost)
        if not self.closed.done():
            self.closed.set_result(self.close_code)

    # The opening handshake ------------------------------------------------------------

    def _handshake(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        end = buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(buffer) > MAX_HEAD_BYTES:
                self._not_opened(HandshakeError("the response's head is too long"))
            return
        try:
            status, headers = parse_head(bytes(buffer[:end]))
        except HandshakeError as error:
            self._not_opened(error)
            return
        if status == 101:
            self._upgraded(headers, bytes(buffer[end + 4 :]))
        else:
            self._refused(status, headers, bytes(buffer[end + 4 :]))

    def _upgraded(self, headers: dict[str, str], rest: bytes) -> None:
        if headers.get("upgrade", "").lower() != "websocket":
            self._not_opened(HandshakeError("101 without Upgrade: websocket"))
        elif "upgrade" not in headers.get("connection", "").lower():
            self._not_opened(HandshakeError("101 without Connection: Upgrade"))
        elif headers.get("sec-websocket-accept") != self._accept:
            self._not_opened(HandshakeError("101 with a wrong Sec-WebSocket-Accept"))
        elif "sec-websocket-extensions" in headers:
            self._not_opened(HandshakeError("101 with extensions, none asked for"))
        else:
            self._buffer = bytearray()
            self.opened.set_result(None)
            if rest:  # frames that came with the response: held for on_message
                self.data_received(rest)

    def _refused(self, status: int, headers: dict[str, str], body: bytes) -> None:
        """The body is the Content-Length's bytes, waited for; without one, those that
        came with the head."""
        try:
            length = int(headers.get("content-length", len(body)))
        except ValueError:
            length = len(body)
        if len(body) < length:
            return  # more of the body to come
        self._not_opened(Refused(status, headers, body[:length]))

    def _not_opened(self, error: Exception) -> None:
        self.opened.set_exception(error)
        self._closing = True
        self.transport.close()

    # Frames from the server -----------------------------------------------------------

    def _frames(self, data: bytes) -> None:
        """Take every complete frame in `data`; keep the rest for the next data."""
        at, size = 0, len(data)
        while at < size and not self._closing:
            head, length = head_of(data, at)
            if length < 0 or (length <= MAX_FRAME_BYTES and at + head + length > size):
                self._buffer += data[at:]  # a frame's first bytes: kept until it has come
                self._need = head + max(length, 0)
                return
            first, second = data[at], data[at + 1]
            if first & 0x70 or second & 0x80:  # reserved bits, or masked by the server
                self._close(PROTOCOL_ERROR)
            elif length > MAX_FRAME_BYTES:
                self._close(TOO_BIG)
            else:
                at += head + length
                self._frame(first, data[at - length : at])

    def _frame(self, first: int, payload: bytes) -> None:
        opcode, final = first & 0x0F, first & 0x80
        if opcode == OP_TEXT and final and self._parts is None:
            self._text(payload)
        elif opcode in (OP_TEXT, OP_CONTINUATION):
            self._fragment(opcode, final, payload)
        elif opcode >= OP_CLOSE and (not final or len(payload) > 125):
            self._close(PROTOCOL_ERROR)
        elif opcode == OP_PING:
            self.transport.write(frame(OP_PONG, payload))
        elif opcode == OP_CLOSE:
            self._closed_by_server(payload)
        elif opcode == OP_BINARY:
            self._close(UNSUPPORTED)
        elif opcode != OP_PONG:
            self._close(PROTOCOL_ERROR)

    def _text(self, payload: bytes) -> None:
        try:
            text = payload.decode()
        except UnicodeDecodeError:
            self._close(NOT_UTF8)
            return
        self._deliver(text)

    def _fragment(self, opcode: int, final: int, payload: bytes) -> None:
        """A text message in fragments: the first (OP_TEXT), then continuations."""
        parts = self._parts
        if (opcode == OP_TEXT) != (parts is None):  # a new message inside one, or none
            self._close(PROTOCOL_ERROR)
            return
        if parts is None:
            parts = self._parts = []
        parts.append(payload)
        if sum(map(len, parts)) > MAX_FRAME_BYTES:
            self._close(TOO_BIG)
        elif final:
            self._parts = None
            self._text(b"".join(parts))

    def _closed_by_server(self, payload: bytes) -> None:
        """Answer with the same code (or none, as it came) and close the connection."""
        self.close_code = int.from_bytes(payload[:2], "big") if len(payload) >= 2 else NO_CODE
        self._close(self.close_code, payload[:2])

    def _fail(self, error: Exception) -> None:
        if not self.closed.done():
            self.closed.set_exception(error)
        if not self._closing:
            self._close(INTERNAL_ERROR)
