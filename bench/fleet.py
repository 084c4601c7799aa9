"""A fleet of real agents on one machine: how fast they connect, and how fast an alert
and a command reach them.

Run as a module from the repository root, with the project's interpreter (.venv/bin/python):

    python -m bench.fleet                    # 1,000 agents, 5 rounds of each
    python -m bench.fleet --agents 200 --rounds 3

Real parts: Uvicorn serving the agent sockets, Celery workers running the tree,
PostgreSQL and Redis (private ones under var/bench unless DATABASE_URL / REDIS_URL are
set), and the fleet simulator (`manage.py simulate_fleet`) as separate processes of
real WebSocket clients. Latency = publish (this process) -> notification read by the
agent (fleet process), on the same clock.

Printed: how fast the agents log in (all of them at once, as after a restart of the
console) and then advertise their models; for an alert to every agent and a command to
a third of them (selector `receiver.software == "IIS"`), median / p95 / p99 of the
publish-to-receipt latency, split into publish -> leaf's push sent (the tree) and push
sent -> receipt (the channel layer, the web process, the socket); and, as the baseline
measured in the same run, the same push sent straight through the channel layer to
every agent's connection (no tree, no database), with the ratio of the two. Each phase
says the machine's load and the CPU time each part of the stack spent in it; two lines
put the server's cost per unit: its CPU time (web, tree workers, PostgreSQL and Redis)
per answered delivery in the rounds, and the web processes' memory per connected agent.
Last (unless --no-outage), every web process is killed at once and started again, and
the time until every agent is logged in again is printed. Interrupted (Ctrl-C or
SIGTERM), it stops every process and private server it started.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from functools import partial
from pathlib import Path

from bench.sampling import print_top_frames, profiled
from bench.services import (
    cpu_seconds_each,
    fleet_stats,
    fresh_database,
    provide_services,
    start_fleet,
    start_process,
    stop_on_sigterm,
    wait_for_tree_idle,
    worker_argv,
)
from launcher.supervisor import listening_socket, web_server_argv

ROOT = Path(__file__).resolve().parent.parent

PORT = int(os.environ.get("BENCH_PORT", "8931"))
ROUND_TIMEOUT_S = 60.0
# How long the connected fleet is left idle before the rounds, to measure what it costs
# (two heartbeats: AGENT_HEARTBEAT_S).
IDLE_S = 60.0
NO_AGENTS_S = 30.0
OUTAGE_TIMEOUT_S = 120.0
IIS = 'receiver.software == "IIS"'
PUSH_LOG_KEY = "sn-bench:pushes"


class Console:
    """`web` web processes sharing one listening socket (kept, so that they can be
    killed and started again on it), and Celery workers for the tree."""

    def __init__(self, env: dict[str, str], workers: int, web: int, asgi: str) -> None:
        self.env = env
        self.asgi = asgi
        self.listener = listening_socket("127.0.0.1", PORT)
        self.log = open(ROOT / "var" / "bench" / "web.log", "w")  # noqa: SIM115 (kept open)
        self.web = [self._start_web() for _ in range(web)]
        quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        self.workers = [
            start_process(worker_argv(f"fleet{index}"), env, **quiet) for index in range(workers)
        ]
        # The beat's periodic work (sweeps, expiries, summaries) is part of the bill.
        self.beat = start_process(beat_argv(), env, **quiet)

    def _start_web(self) -> subprocess.Popen:
        fd = str(self.listener.fileno())
        if self.asgi == "daphne":  # measured beside Uvicorn (docs/benchmarks.md)
            daphne = str(Path(sys.executable).parent / "daphne")
            # No pings in a day: as under Uvicorn, which sends none (launcher.supervisor).
            argv = [daphne, "--fd", fd, "--ping-interval", "86400"]
            argv += ["console.asgi:application"]
        else:
            # As the launcher starts it: quiet. Verbose, Uvicorn writes two lines for
            # every connection, 7 % of a web process's time in a crowd's logins.
            argv = web_server_argv(self.listener)
        shared = {"stdout": self.log, "stderr": self.log, "pass_fds": (self.listener.fileno(),)}
        return start_process(argv, self.env, **shared)

    def kill_web(self) -> None:
        """SIGKILL every web process, as a crash of the web tier would."""
        for process in self.web:
            os.killpg(process.pid, signal.SIGKILL)
        for process in self.web:
            process.wait()

    def start_web_again(self) -> None:
        self.web = [self._start_web() for _ in self.web]

    @property
    def processes(self) -> list[subprocess.Popen]:
        return [*self.web, *self.workers, self.beat]


def beat_argv() -> list[str]:
    """Celery beat, as a deployment runs it (its schedule file in var/bench)."""
    celery = str(Path(sys.executable).parent / "celery")
    schedule = ROOT / "var" / "bench" / "celerybeat-schedule"
    return [celery, "-A", "console", "--quiet", "beat", "--loglevel", "ERROR",
            "--schedule", str(schedule)]  # fmt: skip


def wait_for_answers(event, expected: int) -> None:
    """Until `expected` receivers have answered and confirmed it (so that rounds do not
    overlap: agents confirm receipt RECEIPT_DELAY_S after it, often after answering)."""
    from django.db.models import F

    from broker.models import Delivery

    done = Delivery.objects.filter(
        event=event,
        state__in=("acked", "failed"),
        receiver__stream__confirmed_position__gte=F("position"),
    )
    deadline = time.monotonic() + ROUND_TIMEOUT_S
    while time.monotonic() < deadline:
        finished = done.count()
        if finished >= expected:
            return
        time.sleep(0.1)
    print(f"  warning: only {finished} of {expected} answered within {ROUND_TIMEOUT_S:g} s")


def publish_rounds(rounds: int, expected_alert: int, expected_command: int) -> None:
    from broker.models import Client
    from broker.services.events import publish_event

    northwest = Client.objects.get(name="northwest-controller")
    national = Client.objects.get(name="intellimune-national")
    for index in range(rounds):
        alert = {"alert": "worm", "threat_level": 4, "target": "IIS", "round": index}
        event = publish_event(
            sender=northwest, content={**alert, "bench": "alert", "sent_at": time.time()}
        )
        wait_for_answers(event, expected_alert)
        command = {"kind": "command", "action": "status", "round": index}
        event = publish_event(
            sender=national,
            content={**command, "bench": "command", "sent_at": time.time()},
            selector=IIS,
        )
        wait_for_answers(event, expected_command)
        time.sleep(0.5)


def push_baseline(rounds: int, client_ids: list[int]) -> None:
    """The floor: one message per agent straight through the channel layer."""
    from broker.push.to_agents import Pushed, push

    for index in range(rounds):
        sent_at = time.time()
        content = {"kind": "probe", "bench": "baseline", "sent_at": sent_at}
        # Position 0: the agents' library drops it as a repeat, but its observer (which
        # measures latency) sees it arrive, as it sees real deliveries arrive.
        push(
            Pushed(
                delivery_id=10**12 + index, position=0, receiver_id=cid, event_id="baseline",
                sender_id=0, channel="baseline", sequence=index + 1, content=content,
                seal=None, seal_read=True,  # no event to read a seal of: none, as read
            )
            for cid in client_ids
        )  # fmt: skip
        # Unacknowledged, so unobservable from here: leave time for the slowest socket.
        time.sleep(2.0 + 0.003 * len(client_ids))


def latencies(stats_dir: str) -> dict[str, list[float]]:
    found: dict[str, list[float]] = {}
    for stats in fleet_stats(stats_dir):
        for label, ms in stats["latencies"]:
            found.setdefault(label, []).append(ms)
    return found


def split_latencies(stats_dir: str) -> dict[str, tuple[list[float], list[float]]]:
    """{label: (publish -> push sent, push sent -> receipt)} in ms, per receipt whose
    delivery a leaf's push logged (settings.PUSH_LOG_KEY)."""
    import redis

    pushed_at = {}
    for entry in redis.Redis.from_url(os.environ["REDIS_URL"]).lrange(PUSH_LOG_KEY, 0, -1):
        push = json.loads(entry)
        pushed_at.update(dict.fromkeys(push["deliveries"], push["sent_at"]))
    found: dict[str, tuple[list[float], list[float]]] = {}
    for stats in fleet_stats(stats_dir):
        for (label, ms), (_, delivery, at) in zip(
            stats["latencies"], stats["receipts"], strict=True
        ):
            if delivery in pushed_at:
                push_ms = (at - pushed_at[delivery]) * 1000
                tree, push = found.setdefault(label, ([], []))
                tree.append(ms - push_ms)
                push.append(push_ms)
    return found


class Phases:
    """The CPU time each part of the stack spent in each phase of the run, and the
    machine's load at its start (the benchmark shares its cores)."""

    def __init__(self, parts: dict[str, list[int]]) -> None:
        self.parts = parts
        self.rows: list[tuple[str, float, dict[str, float], float]] = []

    def measure(self, name: str, phase):
        """Run `phase()` and return what it returns. A part's processes may come and go
        during the phase: one added counts all its CPU time, one that died counts none
        (the outage's killed web processes, which spent next to nothing in it)."""
        load, started = os.getloadavg()[0], time.monotonic()
        before = {part: self._cpu_by_pid(part) for part in self.parts}
        result = phase()
        spent = {
            part: sum(
                cpu - before[part].get(pid, 0.0) for pid, cpu in self._cpu_by_pid(part).items()
            )
            for part in self.parts
        }
        self.rows.append((name, load, spent, time.monotonic() - started))
        return result

    def _cpu_by_pid(self, part: str) -> dict[int, float]:
        # The bench's children are the other parts: its own time only.
        return cpu_seconds_each(self.parts[part], children=part != "bench")

    def print(self) -> None:
        parts = list(self.parts)
        print(f"{'CPU seconds per phase':>34}: " + "  ".join(f"{p:>8}" for p in parts)
              + "   load  wall s")  # fmt: skip
        for name, load, spent, wall_s in self.rows:
            cells = "  ".join(f"{spent[p]:8.2f}" for p in parts)
            print(f"{name:>34}: {cells}   {load:4.1f}  {wall_s:6.1f}")


def server_pids() -> tuple[int, int]:
    """PostgreSQL's postmaster (the parent of our backend) and Redis, asked."""
    import redis
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        backend = cursor.fetchone()[0]
    postmaster = int(Path(f"/proc/{backend}/stat").read_text().rsplit(")", 1)[1].split()[1])
    return postmaster, int(redis.Redis.from_url(os.environ["REDIS_URL"]).info()["process_id"])


def describe(label: str, values: list[float], receivers: int, rounds: int) -> dict:
    values = sorted(values) or [float("nan")]
    figures = {
        "median": statistics.median(values),
        "p95": values[min(len(values) - 1, int(len(values) * 0.95))],
        "p99": values[min(len(values) - 1, int(len(values) * 0.99))],
    }
    print(
        f"{label:>34}: median {figures['median']:7.1f} ms  p95 {figures['p95']:7.1f} ms"
        f"  p99 {figures['p99']:7.1f} ms  ({len(values)} receipts of {receivers * rounds})",
        flush=True,
    )
    return figures


def run(args, env: dict[str, str]) -> None:
    import django

    fresh_database(env)
    env["PUSH_LOG_KEY"] = PUSH_LOG_KEY
    os.environ.update(env)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    django.setup()
    from broker.models import Client, Dispatcher
    from demo.scenario import load_scenario

    started = time.monotonic()
    load_scenario(servers=args.agents)
    analyse_database()
    print(f"set-up: scenario with {args.agents} web servers in {time.monotonic() - started:.1f} s")
    console = Console(env, args.workers, args.web, args.asgi)
    stats_dir = tempfile.mkdtemp(prefix="sn-fleet-bench-")
    fleet, phases, profiles, logged_in = None, None, [], None
    try:
        wait_for_tree_idle(timeout_s=300)
        idle_rss = rss_bytes([p.pid for p in console.web])
        fleet, phases, logged_in, profiles = connect_fleet(args, env, console, stats_dir)
        leaves = Dispatcher.objects.filter(is_leaf=True).count()
        print_memory_per_agent(console, idle_rss, args.agents)
        # Settled, not idle: the fleet's load reports keep a pass per leaf coming.
        wait_for_tree_idle(timeout_s=300, at_most=leaves)
        tree_before = tree_work()
        with maybe_profiled(args, console, "idle") as more:
            phases.measure(f"idle ({IDLE_S:g} s, connected)", lambda: time.sleep(IDLE_S))
        profiles += more
        print_idle_cpu_per_agent(phases, args.agents)
        print_tree_work(tree_before, tree_work(), leaves)
        iis = Client.objects.filter(name__startswith="web-", attribute_values__name="software",
                                    attribute_values__value="IIS").count()  # fmt: skip
        rounds = partial(publish_rounds, args.rounds, args.agents, iis)
        with maybe_profiled(args, console, "rounds") as more:
            phases.measure("rounds (alert, command)", rounds)
        profiles += more
        print_cpu_per_answered_delivery(phases)
        ids = list(Client.objects.filter(name__startswith="web-").values_list("id", flat=True))
        phases.measure("baseline (bare pushes)", lambda: push_baseline(args.rounds, ids))
        if args.outage:
            outage = partial(come_back_after_an_outage, console, logged_in, args.agents,
                             web_pids=phases.parts["web"])  # fmt: skip
            phases.measure("outage (kill, all back)", outage)
    finally:
        stop([fleet])  # first: its agents write what they received as they stop
        stop(console.processes)
    report(args, stats_dir, iis, phases)
    if args.outage and logged_in is not None:
        print_attempts_after_the_outage(stats_dir, logged_in, args.agents)
    print_top_frames(profiles)


def print_attempts_after_the_outage(stats_dir: str, logged_in: LoggedIn, agents: int) -> None:
    """The connections the light fleet tried after it was logged in (the outage's, as
    nothing else drops them), per agent, and how many agents gave up."""
    stats = fleet_stats(stats_dir)
    if not stats or any("attempts" not in s for s in stats):
        return
    again = sum(sum(s["attempts"]) for s in stats) - logged_in.attempts_when_ready
    gave_up = sum(s["stopped"] for s in stats)
    print(f"{'login attempts after the outage':>34}: {again / agents:.2f} per agent"
          f" ({again} for {agents}); {gave_up} gave up", flush=True)  # fmt: skip


@contextlib.contextmanager
def maybe_profiled(args, console: Console, phase: str):
    """With --profile, py-spy on the first web process and tree worker in the block."""
    if not args.profile:
        yield []
        return
    pids = {"web": console.web[0].pid, "tree worker": console.workers[0].pid}
    with profiled(pids, phase) as profiles:
        yield profiles


def analyse_database() -> None:
    """ANALYZE the tables the scenario filled, as a deployed database's are: otherwise
    autovacuum does it during the first phase, billed to the logins (seen: PostgreSQL's
    CPU per login from 0.5 to 1.4 ms from one run to the next). Not the empty ones
    (deliveries, events): analysed empty, their plans would be a small table's once the
    rounds fill them (PostgreSQL's CPU per delivery rose from 0.2 to 1.8 ms)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT relname FROM pg_stat_user_tables WHERE n_live_tup > 0")
        filled = [name for (name,) in cursor.fetchall()]
        for name in filled:
            cursor.execute(f'ANALYZE "{name}"')


def rss_bytes(pids: list[int]) -> int:
    """The resident memory of these processes, as /proc has it."""
    total = 0
    for pid in pids:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1]) * 1024
    return total


def print_memory_per_agent(console: Console, idle_rss: int, agents: int) -> None:
    """The web processes' memory over the sockets they hold: all of it, and what the
    connections added to the processes as they were before."""
    rss = rss_bytes([p.pid for p in console.web])
    print(f"{'server memory per connected agent':>34}: {rss / agents / 1024:.1f} KB"
          f" (web RSS {rss / 2**20:.0f} MB over {agents} sockets;"
          f" {(rss - idle_rss) / agents / 1024:.1f} KB each beyond the idle processes'"
          f" {idle_rss / 2**20:.0f} MB)", flush=True)  # fmt: skip


# The server's bill: what a deployment pays for, the fleet (other machines') apart.
SERVER_PARTS = ("web", "workers", "beat", "postgres", "redis")


def server_bill(
    spent: dict[str, float], per: float, scale: float = 1000.0, unit: str = "ms"
) -> str:
    """The server's CPU seconds in `spent`, over `per` units, times `scale` (1000: in
    ms), with each part's share: "1.23 ms (web 0.80, workers 0.20, ...)"."""
    parts = ", ".join(f"{part} {spent[part] * scale / per:.2f}" for part in SERVER_PARTS)
    return f"{sum(spent[p] for p in SERVER_PARTS) * scale / per:.2f} {unit} ({parts})"


def print_cpu_per_login(phases: Phases, agents: int, reports: list[dict]) -> None:
    """The connect phase (login with a token, advertise, the replay) over the agents:
    the server's CPU, and the fleet's beside it (other machines' in a deployment), as
    the light fleet's processes measured themselves from their first connection (the
    phase's fleet column also has their start and the provisioning)."""
    _, _, spent, _ = phases.rows[-1]
    print(f"{'server CPU per login':>34}: {server_bill(spent, agents)}", flush=True)
    if all("connect_cpu_s" in report for report in reports):
        fleet_s = sum(report["connect_cpu_s"] for report in reports)
        print(f"{'fleet CPU per login':>34}: {fleet_s * 1000 / agents:.2f} ms"
              " (the light fleet's own, from its first connection)", flush=True)  # fmt: skip


def print_idle_cpu_per_agent(phases: Phases, agents: int) -> None:
    """What the server spends on connected agents that receive nothing (heartbeats and
    confirmations, presence, the agents' load updates, the beat's sweeps): per 1,000
    agents, as a share of one core."""
    _, _, spent, wall_s = phases.rows[-1]
    server_s = sum(spent[part] for part in SERVER_PARTS)
    share = server_s / wall_s / agents * 1000 * 100
    per_minute = server_bill(spent, wall_s / 60 * agents / 1000, scale=1.0, unit="CPU-s a minute")
    print(f"{'idle server CPU per 1,000 agents':>34}: {share:.2f} % of a core ({per_minute})",
          flush=True)  # fmt: skip
    _, _, alone, alone_s = phases.rows[0]
    beyond = beyond_rate(spent, wall_s, alone, alone_s)
    server_alone = sum(alone[part] for part in SERVER_PARTS) / alone_s * 100
    beyond_s = sum(beyond.values())
    per_minute = server_bill(beyond, wall_s / 60 * agents / 1000, scale=1.0, unit="CPU-s a minute")
    print(f"{'beyond the server without agents':>34}: {beyond_s / wall_s / agents * 1000 * 100:.2f}"
          f" % of a core ({per_minute}); without agents the server spent"
          f" {server_alone:.2f} % of a core", flush=True)  # fmt: skip


def tree_work() -> tuple[int, int]:
    """(client changes logged, summary versions stored) so far, summed over the tree."""
    from django.db.models import Max, Sum

    from broker.models import ClientChange, DispatcherSummary

    changes = ClientChange.objects.aggregate(last=Max("id"))["last"] or 0
    versions = DispatcherSummary.objects.aggregate(stored=Sum("version"))["stored"] or 0
    return changes, versions


def print_tree_work(before: tuple[int, int], after: tuple[int, int], leaves: int) -> None:
    """The tree's work in the idle minute: the changes its leaves took in, and how many
    summary versions they and the dispatchers above stored (each one a refresh upward)."""
    changes, versions = (b - a for a, b in zip(before, after, strict=True))
    print(f"{'the tree in the idle minute':>34}: {changes} client changes at {leaves} leaves,"
          f" {versions} summary versions stored", flush=True)  # fmt: skip


def beyond_rate(spent: dict, wall_s: float, base: dict, base_s: float) -> dict[str, float]:
    """Each server part's CPU seconds in `spent` (over `wall_s`) beyond what it spends
    at the rate of another phase (`base` over `base_s`)."""
    return {part: spent[part] - base[part] * wall_s / base_s for part in SERVER_PARTS}


def print_cpu_per_answered_delivery(phases: Phases) -> None:
    """The server's CPU time in the rounds (the fleet and the bench apart) over the
    deliveries that were answered in them, and the fleet's beside it."""
    from broker.models import Delivery

    answered = Delivery.objects.filter(
        state__in=("acked", "failed"), event__content__bench__in=["alert", "command"]
    ).count()
    _, _, spent, wall_s = phases.rows[-1]
    per = max(answered, 1)
    print(f"{'server CPU per answered delivery':>34}: {server_bill(spent, per)}"
          f" over {answered} answered", flush=True)  # fmt: skip
    # The connected fleet's heartbeats and load reports go on during the rounds: what
    # the deliveries cost is what the server spent beyond its idle rate (the phase
    # before), as the idle figure is given beyond the server without agents.
    _, _, idle, idle_s = phases.rows[-2]
    beyond = beyond_rate(spent, wall_s, idle, idle_s)
    print(f"{'beyond the idle fleet':>34}: {server_bill(beyond, per)}", flush=True)
    print(f"{'fleet CPU per answered delivery':>34}: {spent['fleet'] * 1000 / per:.3f} ms"
          " (the simulator's)", flush=True)  # fmt: skip


class LoggedIn:
    """How many of the fleet's agents are logged in, as its processes say each time it
    changes (demo/simulator.py); read from the fleet's output in a thread of its own."""

    def __init__(self, fleet: subprocess.Popen) -> None:
        self.latest: dict[int, dict] = {}  # fleet process -> its latest report
        self.attempts_when_ready = 0  # connections tried until all were logged in
        self.thread = threading.Thread(target=self._read, args=(fleet,), daemon=True)
        self.thread.start()

    def _read(self, fleet: subprocess.Popen) -> None:
        for line in fleet.stdout:
            if line.startswith("{") and "logged_in" in line:
                report = json.loads(line)
                self.latest[report["fleet"]] = report

    def now_since(self, since: float) -> int:
        """How many are logged in, by the reports of fleet processes made after `since`
        (unix time); a process that has said nothing since counts none."""
        return sum(r["logged_in"] for r in self.latest.values() if r["at"] > since)

    def all_back_since(self, since: float, agents: int) -> float | None:
        """When the last agent was logged in again, if all are and every fleet process
        said so after `since` (unix time); else None."""
        reports = list(self.latest.values())
        back = sum(r["logged_in"] for r in reports) == agents
        if back and reports and all(r["at"] > since for r in reports):
            return max(r["at"] for r in reports)
        return None


def come_back_after_an_outage(
    console: Console, logged_in: LoggedIn, agents: int, *, web_pids: list[int]
) -> None:
    """Kill every web process at once, start them again (their pids added to
    `web_pids`, for the phase's CPU time), and time until every agent is logged in
    again."""
    killed_at = time.time()
    console.kill_web()
    console.start_web_again()
    web_pids.extend(process.pid for process in console.web)
    back_at, every_10_s = _wait_until_all_back(logged_in, killed_at, agents)
    if back_at is None:
        now = logged_in.now_since(killed_at)
        print(f"  warning: {now} of {agents} agents logged in {OUTAGE_TIMEOUT_S:g} s"
              " after the kill")  # fmt: skip
    else:
        print(f"{'back after every web process died':>34}: all {agents} agents logged in"
              f" again {back_at - killed_at:.1f} s after the kill")  # fmt: skip
    if every_10_s:
        print(f"{'logged in again, every 10 s':>34}: {', '.join(map(str, every_10_s))}")


def _wait_until_all_back(
    logged_in: LoggedIn, killed_at: float, agents: int
) -> tuple[float | None, list[int]]:
    """When the last agent was back (None if not within OUTAGE_TIMEOUT_S), and how many
    were logged in 10, 20, 30... s after the kill until then."""
    deadline, every_10_s = time.monotonic() + OUTAGE_TIMEOUT_S, []
    while time.monotonic() < deadline:
        back_at = logged_in.all_back_since(killed_at, agents)
        if back_at is not None:
            return back_at, every_10_s
        if time.time() - killed_at >= 10 * (len(every_10_s) + 1):
            every_10_s.append(logged_in.now_since(killed_at))
        time.sleep(0.2)
    return None, every_10_s


def connect_fleet(args, env, console: Console, stats_dir):
    """Start the fleet, print how fast it logged in and advertised; the fleet, the
    phases' CPU accounting (whose first phase this is) and who is logged in."""
    postgres, redis_server = server_pids()
    parts = {
        "web": [p.pid for p in console.web],
        "workers": [p.pid for p in console.workers],
        "beat": [console.beat.pid],
        "postgres": [postgres],
        "redis": [redis_server],
        "fleet": [],
        "bench": [os.getpid()],
    }
    phases, reports = Phases(parts), []

    def start():
        fleet = start_fleet(
            env, port=PORT, agents=args.agents, processes=args.processes,
            load_interval_s=args.load_interval_s,
            stats_dir=stats_dir, reports=reports, light=args.fleet == "light",
        )  # fmt: skip
        parts["fleet"].append(fleet.pid)  # all its CPU time is this phase's
        return fleet

    # What the server spends with no agent at all (the beat's sweeps, the workers' and
    # PostgreSQL's own upkeep): the idle figure per 1,000 agents is also given beyond it.
    phases.measure(f"idle ({NO_AGENTS_S:g} s, no agents)", lambda: time.sleep(NO_AGENTS_S))
    started = time.monotonic()
    with maybe_profiled(args, console, "connect") as profiles:
        fleet = phases.measure("connect (login, advertise)", start)
    wall_s = time.monotonic() - started
    print_cpu_per_login(phases, args.agents, reports)
    login_s = max(r["login_s"] for r in reports)
    connect_s = max(r["connect_s"] for r in reports)
    print(f"{'logins':>34}: {args.agents} agents logged in at once in {login_s:.2f} s"
          f" ({args.agents / login_s:.0f} per second)", flush=True)  # fmt: skip
    print(f"{'connect':>34}: logged in and advertised in {connect_s:.2f} s"
          f" ({args.agents / connect_s:.0f} per second; {wall_s:.1f} s with provisioning)",
          flush=True)  # fmt: skip
    print(f"{'sockets per web process':>34}: {sockets_per_process()}", flush=True)
    logged_in = LoggedIn(fleet)
    logged_in.attempts_when_ready = sum(report.get("attempts", 0) for report in reports)
    return fleet, phases, logged_in, profiles


def sockets_per_process() -> list[int]:
    """How the agents' connections spread over the web processes, as the channel
    layer's groups have them (a channel's name before its '!' names its process)."""
    import redis

    server, counts = redis.Redis.from_url(os.environ["REDIS_URL"]), {}
    for key in server.scan_iter("sn-channels:group:client.*", count=1000):
        for member in server.zrange(key, 0, -1):
            process = member.split(b"!")[0]
            counts[process] = counts.get(process, 0) + 1
    return sorted(counts.values())


def stop(processes: list) -> None:
    """Terminate, and kill with their children those still there a minute later."""
    for process in processes:
        if process is not None:
            process.terminate()
    for process in processes:
        if process is None:
            continue
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            print(f"  warning: {process.args[:3]} did not stop; killed", flush=True)
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def report(args, stats_dir: str, iis: int, phases) -> None:
    found = latencies(stats_dir)
    alert = describe("alert to every agent", found.get("alert", []), args.agents, args.rounds)
    describe(f"command to {iis} agents (IIS)", found.get("command", []), iis, args.rounds)
    base = describe("baseline: bare channel-layer push", found.get("baseline", []), args.agents,
                    args.rounds)  # fmt: skip
    print(f"{'alert / baseline':>34}: p95 x{alert['p95'] / base['p95']:.1f}, "
          f"median x{alert['median'] / base['median']:.1f}")  # fmt: skip
    for label, (tree, push) in split_latencies(stats_dir).items():
        for part, values in ((f"{label}: publish -> push sent", tree),
                             (f"{label}: push sent -> receipt", push)):  # fmt: skip
            describe(part, values, len(values), 1)
    # The baseline's probes (position 0) are dropped as repeats by design: not counted.
    probes = len(found.get("baseline", []))
    repeats = sum(stats.get("repeats_dropped", 0) for stats in fleet_stats(stats_dir)) - probes
    print(f"{'repeats dropped by the agents':>34}: {repeats} (timed once, at first arrival;"
          f" besides the {probes} baseline probes)")  # fmt: skip
    if phases is not None:
        phases.print()


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.fleet", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--agents", type=int, default=1000)
    parser.add_argument("--processes", type=int, default=1, help="fleet processes")
    parser.add_argument(
        "--fleet", choices=("light", "agents"), default="light",
        help="the light fleet (the protocol only: the server's cost, measured apart) or the "
        "real agents (sn-agent's service, a journal on disk and a process per action)",
    )  # fmt: skip
    parser.add_argument(
        "--load-interval-s", type=float, default=60.0,
        help="how often each agent's load moves and is stated (an `update`), on average; "
        "3600 leaves the idle minute to the heartbeats, to tell the two costs apart",
    )  # fmt: skip
    parser.add_argument("--workers", type=int, default=2, help="Celery worker processes")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--web", type=int, default=1, help="web processes (one socket)")
    parser.add_argument(
        "--asgi", choices=("daphne", "uvicorn"), default="uvicorn",
        help="the web processes' ASGI server (the console runs Uvicorn)",
    )  # fmt: skip
    parser.add_argument(
        "--profile", action="store_true",
        help="sample the first web process and tree worker with py-spy while idle and in "
        "the rounds, and print their top frames",
    )  # fmt: skip
    parser.add_argument(
        "--no-outage", dest="outage", action="store_false",
        help="skip the last phase: every web process killed, the fleet timed coming back",
    )  # fmt: skip
    args = parser.parse_args()
    stop_on_sigterm()
    env = dict(os.environ)
    env.setdefault("SECRET_KEY", secrets.token_urlsafe(40))
    env.setdefault("LOG_LEVEL", "WARNING")
    started = provide_services(env)
    print(
        f"fleet: {args.agents} {'light ' if args.fleet == 'light' else ''}agents in"
        f" {args.processes} processes, {args.workers} workers,"
        f" {args.web} {args.asgi}, {args.rounds} rounds",
        flush=True,
    )
    try:
        run(args, env)
    finally:
        for server in reversed(started):
            server.stop()


if __name__ == "__main__":
    main()
