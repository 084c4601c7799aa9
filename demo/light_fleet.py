"""A light fleet for the scale benchmarks: thousands of simulated web servers per
process on one event loop, speaking the agent protocol and nothing more.

    python -m demo.light_fleet SPEC.json

SPEC is the one `demo/simulator.py` reads (written by `manage.py simulate_fleet
--light`). Each server logs in with its token (after the last position it has), says
what it is (`acts_on` "anything": it checks no signature), advertises its attributes,
confirms what it has at the server's heartbeat interval, sends its load as it drifts,
and answers every notification at once in the same frame that confirms its receipt:
alerts `ok`, commands as the demo's `web_server_ctl` would (`disable-cgi` turns its CGI
off, `shutdown` drops its load to zero, `status` says its state), in the process. It
keeps notifications in stream order (holding back those after a gap, asking for the
gap again), drops repeats, and comes back after a lost connection as the real agent
does: after a `busy` refusal's Retry-After, or with a full-jitter back-off.

What it leaves out, the real agent's (`sn_agent.service`) cost: no journal on disk, no
signature checked, no action as a process of its own. So the CPU a benchmark reads in
the server's processes is the server's, not a simulator's sharing its cores (bench.fleet
prints the fleet's own CPU per login apart). Its WebSocket client is its own too
(`demo/light_socket.py`, on an `asyncio.Protocol`): `websockets`' machinery per
connection and per frame was most of the fleet's CPU per login and per delivery. A
message is taken as it arrives, in the socket's `data_received`, and answered there with
a direct write: no task, no queue per delivery. The real agents stay the fleet of
`./run`, `bench.chaos` and `bench.agent_restarts`.

It writes what `demo/simulator.py` writes (its ready line, its logged-in counts, its
stats file), plus its connection attempts and how many of its servers gave up.
"""

from __future__ import annotations

import asyncio
import os
import random
import resource
import signal
import sys
import time

import orjson
import uvloop

from demo.light_socket import HandshakeError, LightSocket, Refused, open_socket
from demo.simulator import CONNECT_SPREAD_S, say, say_how_many_are_logged_in

SOFTWARE = "sn-light-fleet 1"
RECONNECT_FIRST_S = 0.5
RECONNECT_MAX_S = 30.0
GAP_WAIT_S = 1.0
# Final: the token was revoked, or the session was replaced or refused for good.
FINAL_CLOSE_CODES = {4401, 4403, 4429}
HANDSHAKE_TIMEOUT_S = 60.0
# The server allows 50 frames a second: an answer refused for its rate waits a turn.
RATE_WAIT_S = 0.1
# As sn-agent: heartbeats at the interval the server's welcome asks for, up to this.
HEARTBEAT_MAX_S = 300.0


class Stopped(Exception):
    """The server ended this agent's session for good (a final close code)."""


class LightServer:
    """One simulated web server and its connection, driven by its `serve()` task."""

    def __init__(self, agent: dict, *, url: str, load_interval_s: float, rng) -> None:
        self.token = agent["token"]
        self.values = dict(agent["values"])
        self.url = url
        self.load_interval_s = load_interval_s
        self.rng = rng
        self.state = "running"
        self.position: int | None = None
        self.held: dict[int, dict] = {}
        self.socket: LightSocket | None = None
        self.logged_in = False
        self.heartbeat_s = 30.0
        self.ready = asyncio.Event()
        self.logged_in_at = 0.0
        self.attempts = self.duplicates = 0
        self.stopped = False  # ended for good by the server: it gave up
        self.latencies_ms: list[tuple[str, float]] = []
        self.receipts: list[tuple[str, int, float]] = []
        self.received: list[tuple] = []
        self.unanswered: dict[int, dict] = {}  # delivery -> its ack, until the server has it
        self.tasks: set[asyncio.Task] = set()  # the session's own: ended with it

    @property
    def hostname(self) -> str:
        return self.values["hostname"]

    async def serve(self, delay_s: float) -> None:
        """Connect, log in and answer, again after every lost connection, until
        cancelled or ended for good."""
        await asyncio.sleep(delay_s)
        ceiling = RECONNECT_FIRST_S
        while True:
            asked_s = 0.0
            try:
                await self._session()
                ceiling = RECONNECT_FIRST_S
            except Stopped:
                self.stopped = True
                return
            except (TimeoutError, OSError, HandshakeError) as lost:
                asked_s = retry_after_s(lost)
            await asyncio.sleep(asked_s + self.rng.uniform(0.0, ceiling))
            ceiling = min(ceiling * 2, RECONNECT_MAX_S)

    async def _session(self) -> None:
        """One connection, from its handshake to its end (Stopped if the server ended
        it for good)."""
        self.attempts += 1
        self.socket = socket = await open_socket(self.url, timeout_s=HANDSHAKE_TIMEOUT_S)
        try:
            socket.on_message = self._receive
            self._login()
            await socket.closed
        finally:
            socket.close()  # when cancelled: the fleet is stopping
            self.socket, self.logged_in = None, False
            for task in list(self.tasks):
                task.cancel()
        if socket.close_code in FINAL_CLOSE_CODES:
            raise Stopped(socket.close_code)

    def _receive(self, text: str) -> None:
        """Every message the server sends, as it comes (from the socket's data)."""
        self._take(orjson.loads(text))

    def _spawn(self, work) -> None:
        task = asyncio.ensure_future(work)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def _login(self) -> None:
        login = {"type": "login", "ref": "login", "token": self.token}
        login["agent"] = {"software": SOFTWARE, "acts_on": "anything"}
        if self.position is not None:
            login["after_position"] = self.position
        self._send(login)

    def _answer_again(self) -> None:
        for ack in list(self.unanswered.values()):  # answers the last session lost
            self._send(ack)

    def _send(self, frame: dict) -> None:
        """Written at once, while connected; else dropped (a new session sends what
        it must: its login, its advertisement, the answers not yet confirmed)."""
        socket = self.socket
        if socket is not None:
            socket.send(orjson.dumps(frame).decode())

    # Frames from the server --------------------------------------------------------

    def _take(self, frame: dict) -> None:
        kind = frame.get("type")
        if kind == "notification":
            self._notification(frame)
        elif kind == "welcome":
            self._welcomed(frame)
        elif kind == "replayed":
            self._covered(frame.get("through", 0))
        elif kind == "ok":
            self._answered(frame)
        elif kind == "error":
            self._refused(frame)

    def _welcomed(self, frame: dict) -> None:
        self.logged_in = True
        self.logged_in_at = self.logged_in_at or time.monotonic()
        self.heartbeat_s = min(HEARTBEAT_MAX_S, float(frame.get("heartbeat_s", 30)))
        values = {**self.values, "load": self._load()}
        advertise = {"type": "advertise", "ref": "advertise", "values": values}
        self._send(advertise)
        self._answer_again()
        self._spawn(self._heartbeats())
        self._spawn(self._drift())

    def _answered(self, frame: dict) -> None:
        ref = frame.get("ref")
        if ref == "advertise":
            self.ready.set()
        elif isinstance(ref, str) and ref.startswith("ack:"):
            self.unanswered.pop(int(ref[4:]), None)
        if frame.get("last_position", 0) > (self.position or 0):  # more is on its way
            self._spawn(self._repair(self.position))

    def _refused(self, frame: dict) -> None:
        """An answer refused for its rate is sent again a moment later; anything else
        refused is the server's word on a bad frame: the benchmark would show it."""
        ref = frame.get("ref")
        if frame.get("code") == "rate_limited" and isinstance(ref, str) and ref.startswith("ack:"):
            self._spawn(self._ack_again(int(ref[4:])))
            return
        say({"fleet": os.getpid(), "server": self.hostname, "error": frame})

    # Notifications, in stream order -------------------------------------------------

    def _notification(self, frame: dict) -> None:
        self._time(frame)
        position = frame.get("position", 0)
        if self.position is None:  # a first login's replay: in order, nothing before it
            self._handle(frame)
        elif position <= self.position or position in self.held:
            self.duplicates += 1
        else:
            self.held[position] = frame
            self._release()

    def _release(self) -> None:
        while self.position is not None and self.position + 1 in self.held:
            self._handle(self.held.pop(self.position + 1))
        if self.held and self.socket is not None:
            self._spawn(self._repair(self.position))

    def _covered(self, through: int) -> None:
        """Everything up to `through` that did not come is gone (expired, or answered
        before a login without a position)."""
        for position in sorted(p for p in self.held if p <= through):
            self._handle(self.held.pop(position))
        self.position = max(self.position or 0, through)
        self._release()

    async def _repair(self, stuck_at: int | None) -> None:
        await asyncio.sleep(GAP_WAIT_S)
        if stuck_at is not None and self.position == stuck_at:
            self._send({"type": "resend", "ref": "resend", "after_position": stuck_at})

    def _handle(self, frame: dict) -> None:
        position = frame.get("position", 0)
        self.position = max(self.position or 0, position)
        content = frame.get("content") or {}
        self.received.append(
            (self.hostname, frame.get("event"), frame.get("sender"), frame.get("channel"),
             frame.get("sequence"), position, frame.get("replay"))
        )  # fmt: skip
        if content.get("kind") == "probe":  # the benchmarks' probes: no answer
            return
        status, result = self._act(content)
        ack = {"type": "ack", "ref": f"ack:{frame['delivery']}", "delivery": frame["delivery"]}
        ack.update(status=status, result=result, position=self.position)
        self.unanswered[frame["delivery"]] = ack
        self._send(ack)

    def _act(self, content: dict) -> tuple[str, dict]:
        """What `web_server_ctl` would answer, done here."""
        action = content.get("action") if content.get("kind") == "command" else None
        if action == "disable-cgi":
            self.values["cgi"] = False  # and the server is told, as a provider would
            self._send({"type": "update", "ref": "cgi", "values": {"cgi": False}})
            return "ok", {"exit_code": 0, "output": f"{self.hostname}: CGI disabled"}
        if action == "shutdown":
            self.state = "stopped"
            self._send({"type": "update", "ref": "load", "values": {"load": 0.0}})
            return "ok", {"exit_code": 0, "output": f"{self.hostname}: web server stopped"}
        if action == "status":
            status = {"hostname": self.hostname, "cgi": self.values["cgi"], "load": self._load()}
            return "ok", {
                "exit_code": 0,
                "output": orjson.dumps({**status, "state": self.state}).decode(),
            }
        if action is None:  # an alert: noted
            return "ok", {}
        return "failed", {"error": f"{self.hostname}: unknown action {action}"}

    async def _ack_again(self, delivery: int) -> None:
        """An answer refused for its rate, sent again once the rate allows."""
        await asyncio.sleep(RATE_WAIT_S)
        if delivery in self.unanswered:
            self._send(self.unanswered[delivery])

    def _time(self, frame: dict) -> None:
        sent_at = (frame.get("content") or {}).get("sent_at")
        if isinstance(sent_at, (int, float)):
            now, label = time.time(), str(frame["content"].get("bench", ""))
            self.latencies_ms.append((label, (now - sent_at) * 1000))
            self.receipts.append((label, frame.get("delivery"), now))

    # While connected ----------------------------------------------------------------

    async def _heartbeats(self) -> None:
        # The first at a random point of the interval, as the _drift's first report.
        await asyncio.sleep(self.heartbeat_s * self.rng.uniform(0.0, 1.0))
        while True:
            self._send({"type": "received", "ref": "hb", "position": self.position or 0})
            await asyncio.sleep(self.heartbeat_s)

    async def _drift(self) -> None:
        """The load moves (and the server is told) every load interval or so: the first
        time at a random point of the first interval, as in a fleet that has run for a
        while (the reports spread evenly, not the first of them all a minute late)."""
        wait_s = self.load_interval_s * self.rng.uniform(0.0, 1.0)
        while True:
            await asyncio.sleep(wait_s)
            wait_s = self.load_interval_s * self.rng.uniform(0.5, 1.5)
            load = self._load()
            if self.state == "running":
                drifted = load + self.rng.uniform(-0.15, 0.15)
                self.values["load"] = round(min(0.99, max(0.01, drifted)), 2)
                self._send({"type": "update", "ref": "load", "values": {"load": self._load()}})

    def _load(self) -> float:
        return 0.0 if self.state == "stopped" else self.values["load"]


def retry_after_s(lost: BaseException) -> float:
    """How long a `busy` refusal of the handshake (503, Retry-After) asked to wait."""
    if isinstance(lost, Refused) and lost.status == 503:
        try:
            body = orjson.loads(lost.body or b"{}")
            return float(body.get("retry_after_s") or lost.headers["retry-after"])
        except (ValueError, KeyError, TypeError, AttributeError):
            return 1.0
    return 0.0


async def run_fleet(spec: dict) -> list[LightServer]:
    """Start every server; say when all have logged in and advertised, then serve
    until cancelled."""
    rng = random.Random(spec.get("seed", 1))
    url, interval = spec["url"], spec["load_interval_s"]
    servers = [LightServer(a, url=url, load_interval_s=interval, rng=rng) for a in spec["agents"]]
    started, cpu_at_start = time.monotonic(), cpu_s()
    tasks = [asyncio.ensure_future(s.serve(i * CONNECT_SPREAD_S)) for i, s in enumerate(servers)]
    await asyncio.gather(*(s.ready.wait() for s in servers))
    login_s = max(s.logged_in_at for s in servers) - started
    say({"ready": len(servers), "login_s": round(login_s, 3),
         "connect_s": round(time.monotonic() - started, 3),
         "connect_cpu_s": round(cpu_s() - cpu_at_start, 3),
         "attempts": sum(s.attempts for s in servers)})  # fmt: skip
    tasks.append(asyncio.ensure_future(say_how_many_are_logged_in(servers)))
    try:
        await asyncio.gather(*tasks)
    except asyncio.CancelledError:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return servers


def cpu_s() -> float:
    """This process's CPU time so far (user and system)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return round(usage.ru_utime + usage.ru_stime, 3)


def write_stats(path: str, servers: list[LightServer]) -> None:
    stats = {
        "latencies": [pair for s in servers for pair in s.latencies_ms],
        "receipts": [item for s in servers for item in s.receipts],
        "received": [item for s in servers for item in s.received],
        "repeats_dropped": sum(s.duplicates for s in servers),
        "attempts": [s.attempts for s in servers],
        "stopped": sum(1 for s in servers if s.stopped),
    }
    with open(path, "wb") as file:
        file.write(orjson.dumps(stats))


def main(argv: list[str]) -> int:
    with open(argv[0], "rb") as file:
        spec = orjson.loads(file.read())
    _, most = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (most, most))  # a socket per server
    loop = uvloop.new_event_loop()  # a dependency of the console's, as its web processes run
    fleet = loop.create_task(run_fleet(spec))
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, fleet.cancel)
    try:
        servers = loop.run_until_complete(fleet)
    except asyncio.CancelledError:  # stopped before every server had started
        servers = []
    if spec.get("stats"):
        write_stats(spec["stats"], servers)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
