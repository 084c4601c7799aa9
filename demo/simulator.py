"""Simulated web servers: real agents on real WebSockets, many per process.

No Django here: a fleet process is what a managed node would run, multiplied. The
`simulate_fleet` management command provisions the clients and tokens and starts a few
of these processes:

    python -m demo.simulator SPEC.json

SPEC is {"url": ..., "load_interval_s": ..., "stats": path or null, "agents":
[{"token": ..., "values": {hostname, software, version, cgi, load}}, ...]}.

Each simulated server advertises its model, lets its load drift, and obeys the
scenario's commands: `disable-cgi` turns CGI off, `shutdown` stops it (its load drops to
zero and stays there), `status` reports its values; each is reported back as the
command's result. Alerts are acknowledged as noted.
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
import sys
import time
from dataclasses import dataclass, field

from sn_agent.client import Agent, Notification, Result, SessionEnded
from websockets.exceptions import WebSocketException

# Between two agents' first connections, so as not to stampede: at most 2,000 a second
# per process, well above what a console serves.
CONNECT_SPREAD_S = 0.0005
# How long a stopped fleet waits for what is left (background updates, closing
# handshakes with a console that may be stopping too) before it exits anyway.
FINISH_TIMEOUT_S = 10.0


@dataclass
class SimulatedServer:
    """One web server's agent."""

    url: str
    token: str
    values: dict
    load_interval_s: float
    rng: random.Random
    stopped: bool = False
    latencies_ms: list[tuple[str, float]] = field(default_factory=list)
    receipts: list[tuple[str, int, float]] = field(default_factory=list)  # label, delivery, at
    received: list[tuple] = field(default_factory=list)  # as the application saw them
    timed: set[int] = field(default_factory=set)  # deliveries in `receipts`
    agent: Agent | None = None

    @property
    def hostname(self) -> str:
        return self.values["hostname"]

    async def log_in(self) -> None:
        """Connect and log in."""
        self.agent = Agent(self.url, self.token, observer=self.arrived)
        await self.agent.connect()

    async def advertise(self) -> None:
        """State the whole model."""
        await self.agent.advertise(self.values)

    async def live(self) -> None:
        """Obey notifications and drift, until cancelled or the session ends for good."""
        drifting = asyncio.create_task(self._drift())
        try:
            await self.agent.run(self.obey)
        except SessionEnded as ended:
            print(f"[fleet] {self.hostname}: {ended}", file=sys.stderr)
        finally:
            drifting.cancel()

    def arrived(self, notification: Notification) -> None:
        """Benchmark events carry their publish time: how long they took to get here
        (the first time: a repeat, which the agent drops, is counted by the agent)."""
        sent_at = notification.content.get("sent_at")
        if isinstance(sent_at, int | float) and notification.delivery not in self.timed:
            self.timed.add(notification.delivery)
            now, label = time.time(), str(notification.content.get("bench", ""))
            self.latencies_ms.append((label, (now - sent_at) * 1000))
            self.receipts.append((label, notification.delivery, now))

    def obey(self, notification: Notification) -> Result | None:
        content = notification.content
        self.received.append(
            (self.hostname, notification.event, notification.sender, notification.channel,
             notification.sequence, notification.position, notification.replay)
        )  # fmt: skip
        if content.get("kind") == "probe":
            return None
        if "alert" in content:
            return "ok", {"exit_code": 0, "output": f"{self.hostname}: alert noted"}
        return self._command(content.get("action"))

    def _command(self, action) -> Result:
        if action == "disable-cgi":
            self._change({"cgi": False})
            return "ok", {"exit_code": 0, "output": f"{self.hostname}: CGI disabled"}
        if action == "status":
            return "ok", {"exit_code": 0, "output": json.dumps(self.values, sort_keys=True)}
        if action == "shutdown":
            self.stopped = True
            self._change({"load": 0.0})
            return "ok", {"exit_code": 0, "output": f"{self.hostname}: web server stopped"}
        return "failed", {"exit_code": 2, "output": f"{self.hostname}: unknown action {action!r}"}

    def _change(self, values: dict) -> None:
        self.values.update(values)
        # Reported in the background: the handler must not wait on its own socket.
        asyncio.get_running_loop().create_task(self._send_update(values))

    async def _send_update(self, values: dict) -> None:
        try:
            await self.agent.update(values)
        except Exception as error:  # the next drift or reconnect advertises again
            print(f"[fleet] {self.hostname}: update failed: {error}", file=sys.stderr)

    async def _drift(self) -> None:
        while True:
            await asyncio.sleep(self.load_interval_s * self.rng.uniform(0.5, 1.5))
            if self.stopped:
                continue
            load = self.values["load"] + self.rng.uniform(-0.15, 0.15)
            self._change({"load": round(min(0.99, max(0.01, load)), 2)})


async def run_fleet(spec: dict) -> list[SimulatedServer]:
    """Start every agent of `spec`: all log in, then all advertise (each phase timed,
    so that logins are measured alone); report when all are ready, then live."""
    rng = random.Random(spec.get("seed", 1))
    servers = [
        SimulatedServer(spec["url"], a["token"], dict(a["values"]), spec["load_interval_s"], rng)
        for a in spec["agents"]
    ]
    started = time.monotonic()
    await asyncio.gather(*(_log_in_later(s, i * CONNECT_SPREAD_S) for i, s in enumerate(servers)))
    logged_in = time.monotonic()
    await asyncio.gather(*(_advertise(s) for s in servers))
    ready = {
        "ready": len(servers),
        "login_s": round(logged_in - started, 3),
        "connect_s": round(time.monotonic() - started, 3),
    }
    print(json.dumps(ready), flush=True)
    lives = [asyncio.create_task(s.live()) for s in servers]
    try:
        await asyncio.gather(*lives)
    except asyncio.CancelledError:  # stopped: end every session cleanly
        for task in lives:
            task.cancel()
        await asyncio.gather(*lives, return_exceptions=True)
        await asyncio.gather(*(s.agent.close() for s in servers), return_exceptions=True)
    return servers


async def _log_in_later(server: SimulatedServer, delay_s: float) -> None:
    """Log one agent in; while the console is not up yet, try again, as a node would."""
    await asyncio.sleep(delay_s)
    await _retrying(server, server.log_in)


async def _advertise(server: SimulatedServer) -> None:
    """Advertise one agent's model; a session lost meanwhile is opened again."""

    async def again() -> None:
        if not server.agent.connected:
            await server.agent.connect()
        await server.advertise()

    await _retrying(server, again)


async def _retrying(server: SimulatedServer, attempt) -> None:
    backoff = 0.5
    while True:
        try:
            await attempt()
            return
        except (OSError, TimeoutError, WebSocketException) as error:
            print(f"[fleet] {server.hostname}: {error}; again in {backoff:.1f} s", file=sys.stderr)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 10.0)


def _finish_tasks(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel and wait for what is left (background updates, timers), so that the
    loop closes without tasks destroyed while pending; but not forever: a stopped
    fleet exits."""
    left = asyncio.all_tasks(loop)
    for task in left:
        task.cancel()
    if left:
        loop.run_until_complete(asyncio.wait(left, timeout=FINISH_TIMEOUT_S))


def _once(action):
    done = []

    def run_once() -> None:
        if not done:
            done.append(True)
            action()

    return run_once


def main(argv: list[str]) -> int:
    with open(argv[0]) as file:
        spec = json.load(file)
    loop = asyncio.new_event_loop()
    fleet = loop.create_task(run_fleet(spec))
    # Once: a second signal (the group's, then the simulator's forward) must not cut
    # short the clean-up that the first one started.
    stop = _once(fleet.cancel)
    loop.add_signal_handler(signal.SIGTERM, stop)
    loop.add_signal_handler(signal.SIGINT, stop)
    try:
        servers = loop.run_until_complete(fleet)
    except asyncio.CancelledError:  # stopped before every agent had started
        servers = []
    _finish_tasks(loop)
    if spec.get("stats"):
        with open(spec["stats"], "w") as file:
            json.dump(
                {
                    "latencies": [pair for s in servers for pair in s.latencies_ms],
                    "receipts": [item for s in servers for item in s.receipts],
                    "received": [item for s in servers for item in s.received],
                    "repeats_dropped": sum(s.agent.duplicates for s in servers if s.agent),
                },
                file,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
