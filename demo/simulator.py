"""Simulated web servers, each managed by the real agent (sn_agent), many per process.

No Django here: a fleet process is what managed nodes would run, multiplied. The
`simulate_fleet` management command provisions the clients and tokens and starts a few
of these processes:

    python -m demo.simulator SPEC.json

SPEC is {"url": ..., "load_interval_s": ..., "stats": path or null, "trust": null or
{"authorities": {NAME: [public keys]}, "policy": text}, "agents": [{"token": ...,
"values": {hostname, software, version, cgi, load}}, ...]}. With `trust`, each agent
acts only on signed events that agree (docs/agent.md); without (a console that holds no
authority's key, as some benchmarks run it), each is configured, and shown on the
console, as acting on unsigned events (`insecure_accept_unsigned`).

Each simulated server is a folder whose files stand for its state (hostname, cgi, load,
state), a load that drifts while it runs, and the agent service of the `sn-agent`
package, configured as a real one would be: static attributes, providers that read
`cgi` and `load` from those files, and the demo's commands as configured actions, each
running `web_server_ctl` (in this folder) in the server's folder: `disable-cgi` turns
CGI off, `shutdown` stops the server (its load drops to zero and stays there), `status`
reports its state. Alerts (no action) are answered `ok` (`answer_without_action`). The
actions run as the fleet's own user: they change only files in the server's folder.
The servers' folders, journals included, live in memory-backed storage when the machine
has it (/dev/shm): their disks are simulated too.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import resource
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from sn_agent import logs
from sn_agent.client import Notification
from sn_agent.config import Action, Config, Provider
from sn_agent.service import AgentService

from demo.data_folder import write_new_private

WEB_SERVER_CTL = Path(__file__).resolve().parent / "web_server_ctl"
# Between two agents' first connections, so as not to stampede: at most 2,000 a second
# per process, well above what a console serves.
CONNECT_SPREAD_S = 0.0005
CGI_READ_EVERY_S = 2.0
# How long a stopped fleet waits for what is left before it exits anyway.
FINISH_TIMEOUT_S = 10.0
# How often a fleet process looks how many of its agents are logged in (and says so,
# when it changed: the benchmarks time how long a fleet takes to come back).
LIVE_CHECK_S = 0.2


class SimulatedServer(AgentService):
    """One web server's agent, with what the benchmarks time and count."""

    def __init__(self, config: Config, *, values: dict, load_interval_s: float, rng) -> None:
        super().__init__(config, observer=self.arrived)
        self.values = values
        self.load_interval_s = load_interval_s
        self.rng = rng
        self.ready = asyncio.Event()
        self.logged_in_at = 0.0
        self.latencies_ms: list[tuple[str, float]] = []
        self.receipts: list[tuple[str, int, float]] = []  # label, delivery, at
        self.received: list[tuple] = []  # as the agent's application saw them
        self.timed: set[int] = set()  # deliveries in `receipts`

    @property
    def hostname(self) -> str:
        return self.values["hostname"]

    @property
    def logged_in(self) -> bool:
        """Its agent is connected and its login was accepted."""
        return self.agent is not None and self.agent.logged_in

    @property
    def folder(self) -> Path:
        return self.config.state_dir.parent

    def arrived(self, notification: Notification) -> None:
        """Benchmark events carry their publish time: how long they took to get here
        (the first time: a repeat, which the agent drops, is counted by the agent)."""
        sent_at = notification.content.get("sent_at")
        if isinstance(sent_at, (int, float)) and notification.delivery not in self.timed:
            self.timed.add(notification.delivery)
            now, label = time.time(), str(notification.content.get("bench", ""))
            self.latencies_ms.append((label, (now - sent_at) * 1000))
            self.receipts.append((label, notification.delivery, now))

    async def on_connect(self) -> None:
        self.logged_in_at = self.logged_in_at or time.monotonic()
        await super().on_connect()
        self.ready.set()

    async def handle(self, notification: Notification) -> None:
        self.received.append(
            (self.hostname, notification.event, notification.sender, notification.channel,
             notification.sequence, notification.position, notification.replay)
        )  # fmt: skip
        if notification.content.get("kind") == "probe":  # the benchmarks' probes: no answer
            self.journal.note(notification, action=None, state="noted")
            return
        await super().handle(notification)

    async def drift(self) -> None:
        """The web server's load moves while it runs (its agent measures it)."""
        while True:
            await asyncio.sleep(self.load_interval_s * self.rng.uniform(0.5, 1.5))
            if read(self.folder / "state") == "stopped":
                continue
            load = float(read(self.folder / "load")) + self.rng.uniform(-0.15, 0.15)
            write(self.folder / "load", str(round(min(0.99, max(0.01, load)), 2)))


def read(path: Path) -> str:
    return path.read_text().strip()


def write(path: Path, text: str) -> None:
    """Replace `path`'s content at once (a provider never reads half of it)."""
    fresh = path.with_suffix(".new")
    fresh.write_text(text + "\n")
    fresh.replace(path)


def server_folder(root: Path, url: str, agent: dict, load_interval_s: float, trust) -> Config:
    """Lay out one server's folder and return its agent's configuration."""
    values = agent["values"]
    folder = root / values["hostname"]
    folder.mkdir(parents=True)
    for name in ("hostname", "cgi", "load"):
        write(folder / name, json.dumps(values[name]).strip('"'))
    write(folder / "state", "running")
    write_new_private(folder / "token", agent["token"])  # the folder is new: so is the file
    return agent_config(folder, url, values, load_interval_s=load_interval_s, trust=trust)


def agent_config(
    folder: Path, url: str, values: dict, *, load_interval_s: float = 5.0, trust=None
) -> Config:
    static = {name: values[name] for name in ("hostname", "software", "version")}
    read_file = {
        "cgi": Provider("cgi", "bool", CGI_READ_EVERY_S, file=folder / "cgi"),
        "load": Provider("load", "float", load_interval_s / 2, file=folder / "load"),
    }
    commands = {
        name: Action(name, (str(WEB_SERVER_CTL), name), timeout_s=30, cwd=folder)
        for name in ("disable-cgi", "shutdown", "status")
    }
    policy_file = None
    if trust:  # the demo's fleet verifies: it checks events against its own policy
        policy_file = folder / "policy"
        policy_file.write_text(trust["policy"])
    return Config(
        source=folder / "agent.toml", url=url, token_file=folder / "token",
        state_dir=folder / "agent", attributes=static, providers=read_file,
        actions=commands, answer_without_action=True, policy_file=policy_file,
        authorities=trust and {k: tuple(v) for k, v in trust["authorities"].items()},
        insecure_accept_unsigned=not trust,
    )  # fmt: skip


def fleet_folder() -> Path:
    shared_memory = Path("/dev/shm")
    where = shared_memory if shared_memory.is_dir() else None
    return Path(tempfile.mkdtemp(prefix="sn-fleet-", dir=where))


async def run_fleet(spec: dict, root: Path) -> list[SimulatedServer]:
    """Start every server's agent; report when all have logged in and advertised,
    then serve until cancelled."""
    rng = random.Random(spec.get("seed", 1))
    servers = []
    for agent in spec["agents"]:
        interval = spec["load_interval_s"]
        config = server_folder(root, spec["url"], agent, interval, spec.get("trust"))
        server = SimulatedServer(
            config, values=dict(agent["values"]), load_interval_s=interval, rng=rng
        )
        servers.append(server)
    started = time.monotonic()
    tasks = [asyncio.ensure_future(_serve(s, i * CONNECT_SPREAD_S)) for i, s in enumerate(servers)]
    await asyncio.gather(*(s.ready.wait() for s in servers))
    login_s = max(s.logged_in_at for s in servers) - started
    say({"ready": len(servers), "login_s": round(login_s, 3),
         "connect_s": round(time.monotonic() - started, 3)})  # fmt: skip
    if spec.get("stats"):  # a benchmark watches: it times how fast the fleet comes back
        tasks.append(asyncio.ensure_future(say_how_many_are_logged_in(servers)))
    try:
        await asyncio.gather(*tasks)
    except asyncio.CancelledError:  # stopped: each agent finishes its action, then ends
        for server in servers:
            server.stop()
        await asyncio.gather(*tasks, return_exceptions=True)
    return servers


def say(report: dict) -> None:
    """One JSON line on standard output, in one write: the fleet's processes share it,
    and print() writes the text and its newline apart when output is unbuffered, so
    another process's line could land between them."""
    sys.stdout.write(json.dumps(report) + "\n")
    sys.stdout.flush()


async def say_how_many_are_logged_in(servers: list) -> None:
    """A JSON line {"fleet": pid, "agents": N, "logged_in": n, "at": unix time}
    whenever the number of this process's servers logged in (their `logged_in`, the
    light fleet's as this fleet's) has changed."""
    said = len(servers)
    while True:
        await asyncio.sleep(LIVE_CHECK_S)
        now = sum(1 for s in servers if s.logged_in)
        if now != said:
            report = {"fleet": os.getpid(), "agents": len(servers), "logged_in": now}
            say({**report, "at": time.time()})
            said = now


async def _serve(server: SimulatedServer, delay_s: float) -> None:
    await asyncio.sleep(delay_s)
    drifting = asyncio.ensure_future(server.drift())
    try:
        await server.run()
    finally:
        drifting.cancel()


def _finish_tasks(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel and wait for what is left, but not forever: a stopped fleet exits."""
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


def write_stats(path: str, servers: list[SimulatedServer]) -> None:
    with open(path, "w") as file:
        json.dump(
            {
                "latencies": [pair for s in servers for pair in s.latencies_ms],
                "receipts": [item for s in servers for item in s.receipts],
                "received": [item for s in servers for item in s.received],
                "repeats_dropped": sum(s.agent.duplicates for s in servers if s.agent),
            },
            file,
        )


def main(argv: list[str]) -> int:
    with open(argv[0]) as file:
        spec = json.load(file)
    logs.send_to(None)  # a thousand agents' lines would drown the console's
    # Each agent holds a socket and a journal: more files than the usual 1,024.
    _, most = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (most, most))
    root = fleet_folder()
    loop = asyncio.new_event_loop()
    fleet = loop.create_task(run_fleet(spec, root))
    # Once: a second signal (the group's, then the simulator's forward) must not cut
    # short the clean-up that the first one started.
    stop = _once(fleet.cancel)
    loop.add_signal_handler(signal.SIGTERM, stop)
    loop.add_signal_handler(signal.SIGINT, stop)
    try:
        servers = loop.run_until_complete(fleet)
    except asyncio.CancelledError:  # stopped before every agent had started
        servers = []
    finally:
        _finish_tasks(loop)
        shutil.rmtree(root, ignore_errors=True)
    if spec.get("stats"):
        write_stats(spec["stats"], servers)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
