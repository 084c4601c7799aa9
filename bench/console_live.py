"""How soon an event's page shows its acknowledgements, as an operator's browser sees
them (issue 11).

A real web process (Uvicorn) serves the console. A reader logs in (a session cookie), opens the
console's socket, watches the event's topic and, like static/console/console.js, GETs
the page again over HTTP on each announcement, at most every data-live-interval (the
event page's 250 ms), reading the acknowledged count (`data-acked`) of each answer.
Meanwhile the bench acknowledges the event's deliveries one by one, 200 a second from
four threads, through the service the agents' socket calls (acknowledge_delivery),
recording when each one committed.

An acknowledgement's latency runs from its commit to the arrival of the first
refreshed page whose count includes it. The baselines, measured in the same run: an
announcement group_sent from the bench to the socket, and the socket's ping round trip.
The reader, the acknowledgements and the announcements share the bench's process (one
clock), as they share the machine with the web process and PostgreSQL.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from bench.services import start_process

ACKS_PER_SECOND = 200
# Threads acknowledging at once: one alone, a transaction at a time, cannot keep up
# 200 a second on a busy machine, while a fleet's agents answer side by side.
ACKING_AGENTS = 4
REFRESH_INTERVAL_S = 0.25  # data-live-interval of the event page's live part
BASELINE_MESSAGES = 50
SHOWN_TIMEOUT_S = 15.0  # after the last acknowledgement, until the page shows them all
START_TIMEOUT_S = 30.0
ACKED = re.compile(rb'data-acked="(\d+)"')


@dataclass
class LiveLatency:
    """Milliseconds: per acknowledgement, commit to first shown (None: never shown);
    per baseline message, group_send to the socket, and the ping round trip. Seconds
    from the first acknowledgement's commit to the last's."""

    shown_ms: list[float | None]
    layer_ms: list[float]
    ping_ms: list[float]
    refreshes: int
    acks_s: float


def measure_live(env: dict[str, str], log_path: Path, user, event) -> LiveLatency:
    """Acknowledge every delivery of `event` while a reader logged in as `user` watches
    its page through a Daphne started for this."""
    from broker.models import Delivery
    from broker.push.to_consoles import ANNOUNCE_INTERVAL_S

    rows = Delivery.objects.filter(event=event).select_related("receiver").order_by("pk")
    deliveries = [(d.receiver, d.pk) for d in rows]
    cookie = session_cookie(user)
    with web_process(env, log_path) as base_url:
        reader = PageReader(f"{base_url}/events/{event.pk}/", cookie)
        latency = asyncio.run(_measure(base_url, reader, f"event.{event.pk}", deliveries))
    # The announcements still due go out before the bench stops Redis under them.
    time.sleep(ANNOUNCE_INTERVAL_S)
    return latency


def session_cookie(user) -> str:
    """A logged-in session of `user`, as the browser's Cookie header sends it."""
    from bench.services import logged_in_web_client

    client = logged_in_web_client(user)
    return f"sessionid={client.cookies['sessionid'].value}"


@contextmanager
def web_process(env: dict[str, str], log_path: Path) -> Iterator[str]:
    """One web process serving the console on a free port, started as the launcher
    starts one; yields its base URL."""
    from launcher.supervisor import listening_socket, web_server_argv

    listener = listening_socket("127.0.0.1", 0)
    port = listener.getsockname()[1]
    log = open(log_path, "w")  # noqa: SIM115 (the server writes it until it stops)
    options = {"stdout": log, "stderr": log, "pass_fds": (listener.fileno(),)}
    process = start_process(web_server_argv(listener), env, **options)
    listener.close()  # the server holds it now
    base_url = f"http://127.0.0.1:{port}"
    try:
        _wait_for_http(f"{base_url}/login/", process)
        yield base_url
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=15)
        log.close()


def _wait_for_http(url: str, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the web server exited with {process.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"the web server did not answer {url} in time")


class PageReader:
    """console.js on the event page: on each announcement, a refresh once
    REFRESH_INTERVAL_S has passed since the last one began; each answer's count kept."""

    def __init__(self, url: str, cookie: str) -> None:
        self.url = url
        self.headers = {"Cookie": cookie, "HX-Request": "true"}
        self.shown: list[tuple[float, int]] = []  # (answer received, acknowledged count)
        self.last_refresh = float("-inf")
        self.refresh_pending = False
        self.changed_shown = asyncio.Event()

    def changed(self) -> None:
        if self.refresh_pending:
            return
        self.refresh_pending = True
        delay = max(0.0, self.last_refresh + REFRESH_INTERVAL_S - time.monotonic())
        asyncio.get_running_loop().call_later(delay, lambda: asyncio.ensure_future(self.refresh()))

    async def refresh(self) -> None:
        self.refresh_pending = False
        self.last_refresh = time.monotonic()
        count = await asyncio.to_thread(self.acknowledged)
        self.shown.append((time.monotonic(), count))
        self.changed_shown.set()

    def acknowledged(self) -> int:
        """The page's acknowledged count, read over HTTP."""
        request = urllib.request.Request(self.url, headers=self.headers)
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(ACKED.search(response.read()).group(1))

    async def until_shown(self, count: int, timeout_s: float) -> None:
        """Until a refreshed page shows `count` acknowledgements, or the time is up."""
        deadline = time.monotonic() + timeout_s
        while max((shown for _, shown in self.shown), default=-1) < count:
            self.changed_shown.clear()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            try:
                await asyncio.wait_for(self.changed_shown.wait(), remaining)
            except TimeoutError:
                return


async def _measure(base_url: str, reader: PageReader, topic: str, deliveries) -> LiveLatency:
    from websockets.asyncio.client import connect

    socket_url = base_url.replace("http", "ws", 1) + "/ws/console/"
    headers = {"Cookie": reader.headers["Cookie"], "Origin": base_url}
    async with connect(socket_url, additional_headers=headers) as socket:
        ping_ms = await _ping_round_trips(socket)
        layer_ms = await _announcement_latencies(socket)
        await _watch(socket, [topic])
        await reader.refresh()  # the page as the operator opened it
        listening = asyncio.ensure_future(_pass_on_changes(socket, topic, reader))
        committed = await asyncio.to_thread(acknowledge_all, deliveries, ACKS_PER_SECOND)
        await reader.until_shown(len(committed), SHOWN_TIMEOUT_S)
        listening.cancel()
    return LiveLatency(
        shown_ms=shown_latencies(committed, reader.shown),
        layer_ms=layer_ms,
        ping_ms=ping_ms,
        refreshes=len(reader.shown) - 1,  # the first is the page as opened
        acks_s=committed[-1] - committed[0],
    )


async def _ping_round_trips(socket) -> list[float]:
    """The console socket's ping: socket to the web process, through Redis, and back."""
    timings = []
    for number in range(BASELINE_MESSAGES):
        started = time.monotonic()
        await socket.send(json.dumps({"type": "ping", "sent": number}))
        await _next_of_type(socket, "time")
        timings.append((time.monotonic() - started) * 1000)
    return timings


async def _announcement_latencies(socket) -> list[float]:
    """A bare announcement: group_send here to the socket's "changed", no throttling."""
    from channels.layers import get_channel_layer

    from broker.push.to_consoles import MESSAGE_TYPE, console_group

    topic = f"event.{uuid.uuid4()}"  # a topic no one else announces
    await _watch(socket, [topic])
    layer = get_channel_layer()
    timings = []
    for _ in range(BASELINE_MESSAGES):
        started = time.monotonic()
        await layer.group_send(console_group(topic), {"type": MESSAGE_TYPE, "topic": topic})
        await _next_of_type(socket, "changed")
        timings.append((time.monotonic() - started) * 1000)
        await asyncio.sleep(0.01)
    return timings


async def _watch(socket, topics: list[str]) -> None:
    await socket.send(json.dumps({"type": "watch", "topics": topics}))
    await _next_of_type(socket, "watching")


async def _next_of_type(socket, kind: str) -> dict:
    while True:
        message = json.loads(await asyncio.wait_for(socket.recv(), START_TIMEOUT_S))
        if message["type"] == kind:
            return message
        if message["type"] == "error":
            raise RuntimeError(f"the console socket refused: {message['error']}")


async def _pass_on_changes(socket, topic: str, reader: PageReader) -> None:
    async for raw in socket:
        message = json.loads(raw)
        if message["type"] == "changed" and message["topic"] == topic:
            reader.changed()


def acknowledge_all(deliveries: list, per_second: float) -> list[float]:
    """Acknowledge each (receiver, delivery id) ok, as its agent would: from
    ACKING_AGENTS threads at once, paced together at `per_second`. Returns when each
    committed (time.monotonic), in order."""
    started = time.monotonic()
    committed: list[float] = []
    with ThreadPoolExecutor(ACKING_AGENTS) as pool:
        agents = [
            pool.submit(_acknowledge_share, deliveries, first, started, per_second, committed)
            for first in range(ACKING_AGENTS)
        ]
        for agent in agents:
            agent.result()  # raises what an agent's thread raised
    return sorted(committed)


def _acknowledge_share(deliveries, first: int, started: float, per_second, committed) -> None:
    """Every ACKING_AGENTS-th delivery from `first`, each at its turn."""
    from django.db import connection, transaction

    from broker.audit import Actor
    from broker.services.deliveries import acknowledge_delivery

    try:
        for index in range(first, len(deliveries), ACKING_AGENTS):
            time.sleep(max(0.0, started + index / per_second - time.monotonic()))
            receiver, delivery_id = deliveries[index]
            with transaction.atomic():
                # Registered first, so it runs first when the commit is done.
                transaction.on_commit(lambda: committed.append(time.monotonic()))
                acknowledge_delivery(
                    client=receiver,
                    delivery_id=delivery_id,
                    status="ok",
                    result={"exit_code": 0},
                    actor=Actor("client", receiver.name),
                )
    finally:
        connection.close()  # this thread's own connection


def shown_latencies(committed: list[float], shown: list[tuple[float, int]]) -> list:
    """Per acknowledgement (the n-th committed), milliseconds until a page first
    showed n or more (a count read after the n-th commit); None if none did."""
    latencies: list[float | None] = []
    for number, at in enumerate(committed, start=1):
        first = min((when for when, count in shown if count >= number), default=None)
        latencies.append(None if first is None else (first - at) * 1000)
    return latencies
