"""Chaos: a stream of events to real agents through the real stack while its processes
and servers fail, counted where it matters: in what the agents' applications received.

Run as a module from the repository root, with the project's interpreter (.venv/bin/python):

    python -m bench.chaos                          # 10,000 events to 50 agents, once
    python -m bench.chaos --events 2000 --agents 20 --runs 3

Real parts, as separate processes: Uvicorn (two, sharing one socket), Celery workers
and beat running the dispatcher tree, PostgreSQL and Redis (private ones under
var/bench: the bench restarts them, so it refuses servers given by URL), and the fleet
simulator's agents (broker.client over real WebSockets). The bench publishes alerts of
the Northwest controller on several channels, each addressed to one region's servers,
with an idempotency key, retrying what fails. While it publishes it SIGKILLs a worker,
restarts Redis, stops PostgreSQL for a few seconds and SIGKILLs a web process, each
brought back as a supervisor would.

Printed per run: events accepted; deliveries recorded (database); notifications the
agents' applications received; lost (expected but never received), duplicated and out
of order (per agent and channel) at the agents, all of which must be 0; and, as the
baseline of the same run, the delivery rate before the first fault against the rate
while the faults happened.
"""

from __future__ import annotations

import argparse
import os
import queue
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from bench.services import (
    fleet_stats,
    fresh_database,
    provide_services,
    start_fleet,
    start_process,
    wait_for_tree_idle,
    worker_argv,
)
from launcher.supervisor import listening_socket, web_server_argv

ROOT = Path(__file__).resolve().parent.parent

PORT = int(os.environ.get("BENCH_PORT", "8932"))
REGIONS = ("Northwest", "Northeast", "Southwest", "Southeast")
SETTLE_TIMEOUT_S = 240.0
FAULTS = ("kill a worker", "restart Redis", "stop PostgreSQL", "kill a web process")
OUTAGE_S = 4.0  # how long PostgreSQL stays down, and how long a killed process stays dead


@dataclass
class Stack:
    """The console's processes, which the bench kills and brings back."""

    env: dict[str, str]
    servers: dict[str, object]  # "postgres", "redis": the private servers
    log: object
    listener: object = None
    worker_argvs: list[list[str]] = field(default_factory=list)
    web: list[subprocess.Popen] = field(default_factory=list)
    workers: list[subprocess.Popen] = field(default_factory=list)
    beat: subprocess.Popen | None = None
    fleet: subprocess.Popen | None = None

    def start_console(self, web: int, workers: int) -> None:
        self.listener = listening_socket("127.0.0.1", PORT)  # kept: web restarts on it
        # Read now: a worker may have to be restarted while the database is down.
        self.worker_argvs = [worker_argv(f"chaos{index}") for index in range(workers)]
        self.web = [self._web() for _ in range(web)]
        self.workers = [self._worker(index) for index in range(workers)]
        schedule = tempfile.mktemp(prefix="sn-chaos-beat-")
        celery = str(Path(sys.executable).parent / "celery")
        beat = [celery, "-A", "console", "beat", "--loglevel", "ERROR", "--schedule", schedule]
        self.beat = start_process(beat, self.env, stdout=self.log, stderr=self.log)

    def _web(self) -> subprocess.Popen:
        argv = web_server_argv(self.listener)  # as the launcher starts it
        fds = (self.listener.fileno(),)
        return start_process(argv, self.env, stdout=self.log, stderr=self.log, pass_fds=fds)

    def _worker(self, index: int) -> subprocess.Popen:
        return start_process(self.worker_argvs[index], self.env, stdout=self.log, stderr=self.log)

    def died_unasked(self) -> list[str]:
        """The console's processes that have exited though the bench never killed
        them (those it killed were replaced)."""
        named = [("beat", self.beat), *((f"worker {i}", w) for i, w in enumerate(self.workers))]
        named += [(f"web {i}", w) for i, w in enumerate(self.web)]
        return [f"{name} exited {p.returncode}" for name, p in named if p.poll() is not None]

    def processes(self) -> list[subprocess.Popen]:
        return [p for p in [self.fleet, self.beat, *self.workers, *self.web] if p is not None]

    def stop(self) -> None:
        for process in self.processes():
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in self.processes():
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)

    # Faults, each undone after a while on a thread of its own ------------------------

    def kill_worker(self) -> None:
        victim = self.workers[0]
        os.killpg(victim.pid, signal.SIGKILL)
        victim.wait()
        self._later(lambda: self.workers.__setitem__(0, self._worker(0)))

    def restart_redis(self) -> None:
        """Redis killed and started again after the outage, as a host's restart would
        (its saved data is loaded again: the streams of hops survive)."""
        redis_server = self.servers["redis"]
        redis_server.process.kill()
        redis_server.process.wait()
        self._later(redis_server.start)  # same socket: every URL stays valid

    def stop_postgres(self) -> None:
        postgres = self.servers["postgres"]
        postgres.stop()
        self._later(postgres.start)

    def kill_web(self) -> None:
        victim = self.web[0]
        os.killpg(victim.pid, signal.SIGKILL)
        victim.wait()
        self._later(lambda: self.web.__setitem__(0, self._web()))

    def _later(self, action) -> None:
        """Run `action` OUTAGE_S from now on the bench's one long-lived undo thread: a
        process started from a thread that then ends (a Timer's) is sent SIGTERM at once
        (die_with_parent's signal follows the thread that started it), and the killed
        worker or web process was never really back."""
        _undoing.put((time.monotonic() + OUTAGE_S, action))


def _undo_when_due() -> None:
    while True:
        due, action = _undoing.get()
        time.sleep(max(0.0, due - time.monotonic()))
        action()


# Faults' undoing, in order, by one thread that lives as long as the bench.
_undoing: queue.Queue = queue.Queue()
threading.Thread(target=_undo_when_due, name="undo-faults", daemon=True).start()


@dataclass
class Published:
    """What the publisher got accepted, and what it took."""

    events: dict[str, tuple[str, str, int]] = field(default_factory=dict)  # id -> region...
    retries: int = 0
    fault_times: list[tuple[str, float]] = field(default_factory=list)
    started: float = 0.0
    finished: float = 0.0


def publish_stream(stack: Stack, args, run_index: int) -> Published:
    """Publish `args.events` alerts, injecting the faults at even intervals."""
    from broker.models import Client

    northwest = Client.objects.get(name="northwest-controller")
    published = Published(started=time.monotonic())
    actions = {
        "kill a worker": stack.kill_worker,
        "restart Redis": stack.restart_redis,
        "stop PostgreSQL": stack.stop_postgres,
        "kill a web process": stack.kill_web,
    }
    faults = args.faults
    fault_at = {int(args.events * (k + 1) / (len(faults) + 1)): f for k, f in enumerate(faults)}
    for number in range(args.events):
        if number in fault_at:
            fault = fault_at[number]
            published.fault_times.append((fault, time.monotonic()))
            print(f"  [{number:>6}] {fault}", flush=True)
            actions[fault]()
        _publish_one(northwest, number, args, run_index, published)
    published.finished = time.monotonic()
    return published


def _publish_one(sender, number: int, args, run_index: int, published: Published) -> None:
    """Publish one alert, retrying with its idempotency key until it is accepted."""
    from django.db import close_old_connections

    from broker.services.events import publish_event

    region = REGIONS[number % len(REGIONS)]
    channel = f"chaos-{number % args.channels}"
    content = {"alert": "chaos", "threat_level": 4, "kind": "probe", "n": number}
    while True:
        try:
            event = publish_event(
                sender=sender,
                content=content,
                selector=f'region == "{region}"',
                lifetime_s=args.lifetime,
                channel=channel,
                idempotency_key=f"chaos-{run_index}-{number}",
            )
            published.events[str(event.pk)] = (region, channel, event.sequence)
            return
        except Exception as error:  # the database or Redis is down: try again
            published.retries += 1
            if published.retries % 20 == 1:
                print(f"  [{number:>6}] publish failed ({type(error).__name__}); retrying")
            close_old_connections()
            time.sleep(0.2)


def wait_until_settled(expected: int, timeout_s: float) -> float:
    """Until every expected delivery is recorded and confirmed by its agent; returns
    the seconds it took."""
    from django.db import close_old_connections

    from broker.models import Delivery

    started = time.monotonic()
    confirmed = 0
    while time.monotonic() - started < timeout_s:
        try:
            confirmed = Delivery.objects.filter(state="delivered").count()
        except Exception:
            close_old_connections()
        if confirmed >= expected:
            break
        time.sleep(1.0)
    return time.monotonic() - started


def expected_pairs(published: Published) -> set[tuple[str, str]]:
    """(hostname, event id) for every accepted event and every server of its region:
    every web server's policy accepts the Northwest controller's alerts."""
    from broker.models import AttributeValue

    hosts = dict(AttributeValue.objects.filter(name="hostname").values_list("client_id", "value"))
    by_region: dict[str, list[str]] = {}
    for client_id, region in AttributeValue.objects.filter(
        name="region", client__name__startswith="web-"
    ).values_list("client_id", "value"):
        by_region.setdefault(region, []).append(hosts[client_id])
    return {
        (host, event_id)
        for event_id, (region, _, _) in published.events.items()
        for host in by_region.get(region, [])
    }


def received_by_agents(stats_dir: str) -> tuple[list[tuple], int]:
    """What the agents' applications received, and how many repeats the agents'
    library dropped before them."""
    found, dropped = [], 0
    for stats in fleet_stats(stats_dir):
        found.extend(tuple(item) for item in stats["received"])
        dropped += stats["repeats_dropped"]
    return found, dropped


def out_of_order(received: list[tuple]) -> int:
    """Notifications that came after a later one of the same agent and channel."""
    last: dict[tuple[str, int, str], int] = {}
    late = 0
    for host, _event, sender, channel, sequence, _position, _replay in received:
        key = (host, sender, channel)
        if sequence <= last.get(key, 0):
            late += 1
        last[key] = max(last.get(key, 0), sequence)
    return late


def report(published: Published, expected: set, agents: tuple, recorded: int) -> dict:
    received, dropped = agents
    got = Counter((host, event) for host, event, *_ in received)
    figures = {
        "accepted": len(published.events),
        "expected deliveries": len(expected),
        "delivered (database)": recorded,
        "received (agents)": len(received),
        "lost": len(expected - set(got)),
        "duplicated": sum(count - 1 for count in got.values()),
        "out of order": out_of_order(received),
        "unexpected": len(set(got) - expected),
        "publish retries": published.retries,
        # How much of it the faults made the delivery contract repair:
        "received by a replay": sum(1 for item in received if item[-1]),
        "repeats dropped by agents": dropped,
    }
    for name, value in figures.items():
        print(f"{name:>25}: {value:,}")
    return figures


def rates(published: Published, settle_s: float, expected: int) -> None:
    """Baseline of the same run: publishing rate before the first fault, against the
    rate from the first fault to the end of publishing."""
    first_fault = published.fault_times[0][1]
    calm_events = int(len(published.events) / (len(published.fault_times) + 1))
    calm_rate = calm_events / max(first_fault - published.started, 1e-9)
    chaos_rate = (len(published.events) - calm_events) / max(published.finished - first_fault, 1e-9)
    print(f"{'publish rate, calm':>25}: {calm_rate:,.0f} events/s")
    print(f"{'publish rate, faults':>25}: {chaos_rate:,.0f} events/s "
          f"(x{chaos_rate / calm_rate:.2f} of calm)")  # fmt: skip
    print(f"{'settled after':>25}: {settle_s:.1f} s after the last publish "
          f"({expected:,} deliveries confirmed by the agents)")  # fmt: skip


def one_run(args, env: dict[str, str], servers: dict, run_index: int) -> dict:
    from django.db import connections

    from broker.models import Delivery
    from demo.scenario import load_scenario

    connections.close_all()
    fresh_database(env)
    load_scenario(servers=args.agents)
    log = open(ROOT / "var" / "bench" / f"chaos-{run_index}.log", "w")  # noqa: SIM115
    stack = Stack(env=env, servers=servers, log=log)
    stats_dir = tempfile.mkdtemp(prefix="sn-chaos-")
    deaths: list[str] = []
    try:
        stack.start_console(args.web, args.workers)
        wait_for_tree_idle(timeout_s=120)
        stack.fleet = start_fleet(
            env, port=PORT, agents=args.agents, processes=2, load_interval_s=3600,
            stats_dir=stats_dir, stderr=log,
        )  # fmt: skip
        wait_for_tree_idle(timeout_s=120)
        published = publish_stream(stack, args, run_index)
        expected = expected_pairs(published)
        settle_s = wait_until_settled(len(expected), SETTLE_TIMEOUT_S)
        recorded = Delivery.objects.filter(event_id__in=list(published.events)).count()
        deaths = stack.died_unasked()
    finally:
        stack.stop()
        log.close()
    figures = report(published, expected, received_by_agents(stats_dir), recorded)
    rates(published, settle_s, len(expected))
    return {**figures, **quiet_through_the_faults(Path(log.name), deaths)}


def quiet_through_the_faults(log_path: Path, deaths: list[str]) -> dict:
    """What an operator would see of the faults: tracebacks in the processes' log,
    processes that died without being killed, and how the agents' sockets were closed
    (the agent library logs "connection lost (received 1011 ...)")."""
    text = log_path.read_text(errors="replace")
    codes = Counter(re.findall(r"connection lost \((?:received|sent) (\d{4})", text))
    figures = {
        "tracebacks in the log": text.count("Traceback (most recent call last)"),
        "processes died unasked": len(deaths),
        "agent sockets closed 1011": codes.get("1011", 0),
    }
    for name, value in figures.items():
        print(f"{name:>25}: {value:,}")
    closes = ", ".join(f"{code}: {count}" for code, count in sorted(codes.items()))
    print(f"{'agents saw closes':>25}: {closes or 'none'}")
    if deaths:
        print(f"{'died':>25}: {'; '.join(deaths)}")
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.chaos", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--agents", type=int, default=50)
    parser.add_argument("--channels", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--web", type=int, default=2, help="web processes (one socket)")
    parser.add_argument("--lifetime", type=int, default=3600, help="events' lifetime, seconds")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument(
        "--faults", type=_faults, default=FAULTS,
        help=f"which faults, comma-separated, in order (default: all: {', '.join(FAULTS)})",
    )  # fmt: skip
    args = parser.parse_args()
    if os.environ.get("DATABASE_URL") or os.environ.get("REDIS_URL"):
        print("chaos restarts PostgreSQL and Redis: it runs on private ones (unset the URLs)")
        return 2
    env = _environment()
    started = provide_services(env)
    servers = {"postgres": started[0], "redis": started[1]}
    os.environ.update(env)
    import django

    django.setup()
    print(f"chaos: {args.events:,} events to {args.agents} agents, {args.runs} run(s)")
    failures = 0
    try:
        for run_index in range(args.runs):
            print(f"run {run_index + 1}:", flush=True)
            figures = one_run(args, env, servers, run_index)
            failures += any(figures[k] for k in ("lost", "duplicated", "out of order"))
    finally:
        for server in reversed(started):
            server.stop()
    print(f"runs with loss, duplicates or disorder at the agents: {failures} of {args.runs}")
    return 1 if failures else 0


def _faults(text: str) -> tuple[str, ...]:
    chosen = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = [name for name in chosen if name not in FAULTS]
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(
            f"unknown fault {unknown[0]!r}; choose from: {', '.join(FAULTS)}"
            if unknown
            else "name at least one fault"
        )
    return chosen


def _environment() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("SECRET_KEY", secrets.token_urlsafe(40))
    env.setdefault("LOG_LEVEL", "WARNING")
    env.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    # Faster recovery than production defaults, so that a run takes minutes.
    env.setdefault("CELERY_VISIBILITY_S", "10")
    env.setdefault("AGENT_HEARTBEAT_S", "3")
    env.setdefault("AGENT_REDELIVER_AFTER_S", "3")
    return env


if __name__ == "__main__":
    sys.exit(main())
