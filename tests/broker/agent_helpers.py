"""What the agent-side tests share: the socket URL, who issues their tokens, and
waiting for something the agents do in other processes."""

from __future__ import annotations

import json
import queue
import socket
import subprocess
import threading
import time
from urllib.parse import urlsplit

import pytest
from websockets.client import ClientProtocol
from websockets.exceptions import ConnectionClosed
from websockets.frames import Frame, Opcode
from websockets.protocol import State
from websockets.uri import parse_uri

from broker.audit import Actor

ISSUER = Actor("system", "tests")


def agent_url(base_url: str) -> str:
    """The agent socket of the test server at `base_url` (http://host:port)."""
    return base_url.replace("http://", "ws://") + "/ws/agent/v1/"


def wait_for(condition, what: str, timeout_s: float = 30.0, *, explain=None):
    """Poll `condition` until it holds; return what it returned. After `timeout_s`,
    fail naming `what` (and what `explain()` finds, if given)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.1)
    found = f" (found {explain()})" if explain else ""
    raise AssertionError(f"timed out waiting until {what}{found}")


def close_code(ws, timeout_s: float = 10) -> int:
    """The code the server closes a (sync client's) socket with, frames before it read."""
    with pytest.raises(ConnectionClosed) as closed:
        while True:
            ws.recv(timeout=timeout_s)
    assert closed.value.rcvd is not None, f"closed without a closing frame: {closed.value}"
    return closed.value.rcvd.code


class RawAgentSocket:
    """An agent socket whose every byte the test chooses: it sends frames in one write
    and never answers a closing frame by itself, as a misbehaving agent would not."""

    def __init__(self, url: str) -> None:
        self.protocol = ClientProtocol(parse_uri(url))
        self.pending: list = []  # events read but not yet returned
        address = urlsplit(url)
        self.socket = socket.create_connection((address.hostname, address.port), timeout=10)
        self.protocol.send_request(self.protocol.connect())
        self._flush()
        while self.protocol.handshake_exc is None and self.protocol.state is State.CONNECTING:
            self.protocol.receive_data(self.socket.recv(65536))
        assert self.protocol.state is State.OPEN, self.protocol.handshake_exc

    def __enter__(self) -> RawAgentSocket:
        return self

    def __exit__(self, *exc_info) -> None:
        self.socket.close()

    def send(self, frame: dict) -> None:
        self.send_all([frame])

    def send_all(self, frames: list[dict]) -> None:
        """All `frames` in one write, so the server reads them together."""
        for frame in frames:
            self.protocol.send_text(json.dumps(frame).encode())
        self._flush()

    def receive(self) -> dict:
        """The next text frame from the server."""
        while True:
            self.pending.extend(self.protocol.events_received())
            while self.pending:
                event = self.pending.pop(0)
                if isinstance(event, Frame) and event.opcode is Opcode.TEXT:
                    return json.loads(event.data)
            self.protocol.receive_data(self.socket.recv(65536))

    def _flush(self) -> None:
        self.socket.sendall(b"".join(self.protocol.data_to_send()))


def wait_until_fleet_ready(
    process: subprocess.Popen, *, agents: int, timeout_s: float = 30
) -> None:
    """Until the fleet's processes have said that all `agents` logged in and advertised
    (a JSON line each, demo/simulator.py). A thread reads the fleet's output to its end,
    so that the pipe never fills."""
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(
        target=lambda: [lines.put(line) for line in process.stdout], daemon=True
    ).start()
    ready, deadline = 0, time.monotonic() + timeout_s
    while ready < agents:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise AssertionError(
                f"{ready} of {agents} agents ready after {timeout_s:g} s"
            ) from None
        if line.startswith("{"):
            ready += json.loads(line).get("ready", 0)
