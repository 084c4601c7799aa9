"""The Selective Notification paper's ping-pong experiment, through the real tree.

Run as a module from the repository root, with the project's interpreter (.venv/bin/python):

    python -m bench.pingpong                 # 50 pongers, 30 s per mode
    python -m bench.pingpong --pongers 20 --duration 15

One pinger and N pongers, all broadcast-like: the pinger publishes a ping, every
ponger answers with a pong, and every client (pinger and pongers) receives every ping
and pong. Pongers change an attribute every 10 s; events live 60 s. Round trip = ping
published -> pong pushed to the pinger. The same run is repeated, as baselines measured
in the same run, with matching switched off (blind relay to every client), and at the
transport floor (bench/floor.py: the same hops through the same broker, doing no work:
no database, no matching). Printed too: the database statements per event per hop that
the tree's consumers counted, at leaves and at inner dispatchers.

Real parts: PostgreSQL and Redis (private ones under var/bench unless DATABASE_URL /
REDIS_URL are set), Celery worker processes for the tree, the Redis channel layer for
the pushes. The driver publishes through the broker's services, from one process or,
with --ponger-processes, the pongers from others.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import secrets
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from bench.floor import publish_floor_event
from bench.services import (
    fresh_database,
    provide_services,
    tree_queues,
    wait_for_tree_idle,
    worker_argv,
)

ROOT = Path(__file__).resolve().parent.parent

PING_TIMEOUT_S = 2.0
READY_TIMEOUT_S = 120
ATTRIBUTE_CHANGE_S = 10.0
LIFETIME_S = 60
MODES = ("matching", "relay", "floor")
POLICY = 'accept sender.team == "bench" and event.kind in ["ping", "pong"]'


@dataclass
class Cast:
    pinger: object
    pongers: list
    authority: object
    grants: dict = field(default_factory=dict)


def create_cast(pongers: int) -> Cast:
    """A pinger and pongers, their team attested by an authority, one shared policy."""
    from broker.audit import Actor
    from broker.services.authorities import attest_attributes, create_authority, grant_authority
    from broker.services.clients import (
        AttributeSpec,
        create_client_model,
        register_client,
        state_attributes,
    )
    from broker.services.event_attributes import EventAttributeSpec, declare_event_attributes
    from broker.services.policies import set_policy

    actor = Actor("system", "bench")
    declare_event_attributes(attributes=[EventAttributeSpec("kind", "string")], actor=actor)
    model = create_client_model(
        name="bench-node",
        attributes=[AttributeSpec("team", "string", False), AttributeSpec("load", "float")],
        actor=actor,
    )
    authority, _ = create_authority(
        name="bench-authority",
        display_name="Bench",
        capabilities=model.attributes.filter(name="team"),
        actor=actor,
    )
    clients = []
    for index in range(pongers + 1):
        name = "pinger" if index == 0 else f"ponger-{index:03d}"
        client, _ = register_client(
            name=name, model=model, can_send=True, can_receive=True, actor=actor
        )
        grant = grant_authority(client=client, authority=authority, actor=actor)
        attest_attributes(
            authority=authority, client=client, grant_key=grant, values={"team": "bench"}
        )
        state_attributes(client=client, values={"load": 0.1}, actor=actor)
        set_policy(client=client, text=POLICY, actor=actor)
        clients.append(client)
    return Cast(clients[0], clients[1:], authority)


def start_workers(env: dict[str, str], count: int, mode: str) -> list[subprocess.Popen]:
    worker_env = {**env, "TREE_MATCHING": "true" if mode == "matching" else "false"}
    floor = [sys.executable, "-m", "bench.floor"]
    return [
        subprocess.Popen(
            floor if mode == "floor" else worker_argv(f"bench{index}"),
            env=worker_env,
            cwd=ROOT,
            start_new_session=True,
        )
        for index in range(count)
    ]


def forget_earlier_tasks() -> None:
    """Tasks, hops, flags and counts an earlier mode left name ids of a dropped
    database: purge them."""
    from broker.dispatch import transport
    from console.celery import app

    with app.connection_for_write() as connection:
        for queue in tree_queues():
            connection.default_channel.queue_purge(queue)
        connection.default_channel.client.delete("unacked", "unacked_index")
    client = transport.broker_redis()
    client.delete("-", *client.keys("sn-tree:*"))


@dataclass
class Results:
    round_trips_ms: list[float] = field(default_factory=list)
    ping_fanout_ms: list[float] = field(default_factory=list)
    pong_return_ms: list[float] = field(default_factory=list)
    publish_ms: list[float] = field(default_factory=list)
    published: int = 0
    notifications: int = 0
    lost_pongs: int = 0
    seconds: float = 0.0
    publish_statements: int = 0
    hop_stats: dict = field(default_factory=dict)

    def add(self, other: Results) -> None:
        """Take in what another driving process measured (the pinger's clock rules)."""
        for name in ("round_trips_ms", "ping_fanout_ms", "pong_return_ms", "publish_ms"):
            getattr(self, name).extend(getattr(other, name))
        for name in ("published", "notifications", "lost_pongs", "publish_statements"):
            setattr(self, name, getattr(self, name) + getattr(other, name))


class Experiment:
    """The clients of one driving process over the channel layer: the pinger, which
    plays the rounds and times them, or a share of the pongers, which answer.

    Times that cross processes (a ping's or a pong's sending) travel in the content as
    wall-clock seconds: the processes share the machine's clock."""

    def __init__(self, cast: Cast, clients: list, *, threads: int, floor: bool) -> None:
        self.cast = cast
        self.clients = clients
        self.floor = floor
        self.sequences: dict[int, int] = {}
        self.pool = ThreadPoolExecutor(max_workers=threads)
        self.results = Results()
        self.pending_ping: dict[str, float] = {}
        self.answered: asyncio.Event | None = None
        self.pongs_seen = 0
        self.in_flight: set[asyncio.Task] = set()
        self.counting = True

    async def run_pinger(self, duration: float, ready) -> Results:
        """Play rounds for `duration` seconds once every driving process is `ready`."""
        self.answered = asyncio.Event()
        await self._join_all(ready)
        changer = asyncio.create_task(self._change_attributes())
        started = time.monotonic()
        while time.monotonic() - started < duration:
            await self._one_round()
        self.results.seconds = time.monotonic() - started
        changer.cancel()
        return self.results

    async def run_pongers(self, ready, stop) -> Results:
        """Answer pings until `stop` is set."""
        await self._join_all(ready)
        while not stop.is_set():
            await asyncio.sleep(0.05)
        self.counting = False
        if self.in_flight:
            await asyncio.wait(self.in_flight)
        return self.results

    async def _join_all(self, ready) -> None:
        """Join every client's group on a local channel, as a web process serves its
        sockets (broker.push.layer): the layer's one task reads the process's messages
        and hands each client's share to its handler."""
        from channels.layers import get_channel_layer

        self.layer = get_channel_layer()
        for client in self.clients:
            await self._join(client)
        await asyncio.sleep(0.5)  # let the reader start
        # A driving process that failed to start breaks the barrier: no endless wait.
        await asyncio.get_running_loop().run_in_executor(None, ready.wait, READY_TIMEOUT_S)

    async def _one_round(self) -> None:
        ping_id = secrets.token_hex(6)
        self.answered.clear()
        self.pongs_seen = 0
        self.pending_ping = {ping_id: time.monotonic()}
        await self._publish(self.cast.pinger, {"kind": "ping", "ping": ping_id})
        try:
            await asyncio.wait_for(self.answered.wait(), timeout=PING_TIMEOUT_S)
        except TimeoutError:
            self.results.lost_pongs += len(self.cast.pongers) - self.pongs_seen

    async def _join(self, client) -> None:
        from broker.push.to_agents import MESSAGE_TYPE, client_group

        group = client_group(client.id)
        is_pinger = client.id == self.cast.pinger.id

        async def handle(message: dict) -> None:
            for item in message["groups"][group]:
                self.results.notifications += self.counting
                await self._handle(client, is_pinger, item["content"])

        channel = self.layer.local_channel({MESSAGE_TYPE: handle})
        await self.layer.group_add(group, channel)

    async def _handle(self, client, is_pinger: bool, content: dict) -> None:
        if content["kind"] == "ping" and not is_pinger:
            self.results.ping_fanout_ms.append((time.time() - content["sent"]) * 1000)
            pong = {"kind": "pong", "ping": content["ping"]}
            # Keep a reference: the loop holds tasks only weakly.
            task = asyncio.create_task(self._publish(client, pong))
            self.in_flight.add(task)
            task.add_done_callback(self.in_flight.discard)
        elif content["kind"] == "pong" and is_pinger and content["ping"] in self.pending_ping:
            sent = self.pending_ping[content["ping"]]
            self.results.round_trips_ms.append((time.monotonic() - sent) * 1000)
            self.results.pong_return_ms.append((time.time() - content["sent"]) * 1000)
            self.pongs_seen += 1
            if self.pongs_seen == len(self.cast.pongers):
                self.answered.set()

    async def _publish(self, client, content: dict) -> None:
        loop = asyncio.get_running_loop()
        started = time.monotonic()
        content = {**content, "sent": time.time()}
        if self.floor:
            sequence = self.sequences[client.id] = self.sequences.get(client.id, 0) + 1
            await loop.run_in_executor(
                self.pool, lambda: publish_floor_event(client, sequence, content)
            )
        else:
            await loop.run_in_executor(self.pool, lambda: self._publish_event(client, content))
        self.results.publish_ms.append((time.monotonic() - started) * 1000)
        self.results.published += 1

    def _publish_event(self, client, content: dict) -> None:
        from django.db import connection

        from broker.dispatch.consumer import StatementCounter
        from broker.services.events import publish_event

        statements = StatementCounter()
        with connection.execute_wrapper(statements):
            publish_event(sender=client, content=content, lifetime_s=LIFETIME_S)
        self.results.publish_statements += statements.count

    async def _change_attributes(self) -> None:
        if self.floor:
            return
        from broker.audit import Actor
        from broker.services.clients import state_attributes

        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(ATTRIBUTE_CHANGE_S)
            for index, ponger in enumerate(self.cast.pongers):
                load = round((time.monotonic() * 7 + index) % 100 / 100, 2)
                await loop.run_in_executor(
                    self.pool,
                    lambda p=ponger, v=load: state_attributes(
                        client=p, values={"load": v}, actor=Actor("client", p.name)
                    ),
                )


def run_mode(env: dict[str, str], args, mode: str) -> Results:
    fresh_database(env)
    import django
    from django.db import connections

    connections.close_all()
    django.setup()
    from broker.audit import SYSTEM
    from broker.services.tree import build_tree

    build_tree(depth=args.depth, branching=args.branching, actor=SYSTEM)
    forget_earlier_tasks()
    cast = create_cast(args.pongers)
    if mode == "floor":
        # The cast's attribute changes woke the tree; the floor's relays do no such
        # work, and the tree would otherwise never look idle.
        forget_earlier_tasks()
    workers = start_workers(env, args.workers, mode)
    try:
        wait_for_tree_idle(timeout_s=120)
        results = drive(cast, args, floor=mode == "floor")
        results.hop_stats = hop_stats()
    finally:
        for worker in workers:
            worker.terminate()
        for worker in workers:
            worker.wait(timeout=30)
    connections.close_all()
    return results


def drive(cast: Cast, args, *, floor: bool) -> Results:
    """The pinger in this process, and the pongers too unless --ponger-processes shares
    them among others. On this 2-core machine one process is best: more processes
    take more of the cores the tree runs on. With cores to spare, sharing them lifts
    the bound one process puts on the floor (reading 2,500 notifications a round at 50
    pongers, waiting for its own interpreter lock)."""
    ids = [ponger.id for ponger in cast.pongers]
    shares = [ids[i :: args.ponger_processes] for i in range(args.ponger_processes)]
    shares = [share for share in shares if share]
    # Spawned, not forked: a forked process would share this one's channel-layer
    # client prefix, and so the Redis list this process's channels are read from.
    context = multiprocessing.get_context("spawn")
    ready, stop, answers = context.Barrier(len(shares) + 1), context.Event(), context.Queue()
    children = [
        context.Process(
            target=_pongers, args=(cast.pinger.id, share, args, floor, ready, stop, answers)
        )
        for share in shares
    ]
    for child in children:
        child.start()
    clients = [cast.pinger] if shares else [cast.pinger, *cast.pongers]
    pinger = Experiment(cast, clients, threads=args.threads, floor=floor)
    try:
        results = asyncio.run(pinger.run_pinger(args.duration, ready))
    finally:
        stop.set()
    for _child in children:
        results.add(Results(**answers.get(timeout=120)))
    for child in children:
        child.join(timeout=30)
    return results


def _pongers(pinger_id: int, share: list[int], args, floor: bool, ready, stop, answers) -> None:
    """A process answering for the pongers whose ids are `share`."""
    import django

    django.setup()
    from broker.models import Client

    clients = Client.objects.in_bulk([pinger_id, *share])
    cast = Cast(clients[pinger_id], [clients[i] for i in share], authority=None)
    experiment = Experiment(cast, cast.pongers, threads=args.threads, floor=floor)
    answers.put(asyncio.run(experiment.run_pongers(ready, stop)).__dict__)


def hop_stats() -> dict[str, int]:
    """What the tree's consumers counted (broker/dispatch/consumer.py)."""
    from broker.dispatch import transport
    from broker.dispatch.consumer import STATS

    raw = transport.broker_redis().hgetall(STATS)
    return {key.decode(): int(value) for key, value in raw.items()}


def describe_statements(results: Results) -> None:
    stats = results.hop_stats
    figures = []
    for kind in ("leaf", "inner"):
        events, batches = stats.get(f"{kind}:events", 0), stats.get(f"{kind}:batches", 0)
        if events:
            per_event = stats[f"{kind}:statements"] / events
            per_batch = stats[f"{kind}:statements"] / batches
            figures.append(
                f"{kind} {per_event:.2f} per event ({per_batch:.1f} per batch"
                f" of {events / batches:.1f} events)"
            )
    per_publish = results.publish_statements / max(results.published, 1)
    print(
        f"{'':>22}  database statements per hop: {', '.join(figures) or 'none counted'};"
        f" per publish {per_publish:.1f}",
        flush=True,
    )


def describe(label: str, results: Results) -> dict:
    trips = sorted(results.round_trips_ms) or [float("nan")]
    figures = {
        "median_ms": statistics.median(trips),
        "p99_ms": trips[min(len(trips) - 1, int(len(trips) * 0.99))],
        "mean_ms": statistics.fmean(trips),
        "stdev_ms": statistics.pstdev(trips) if len(trips) > 1 else 0.0,
        "events_s": results.published / results.seconds,
        "notifications_s": results.notifications / results.seconds,
    }
    f = figures
    print(
        f"{label:>22}: round trip median {f['median_ms']:7.1f} ms  p99 {f['p99_ms']:7.1f} ms"
        f"  (mean {f['mean_ms']:.1f}, s.d. {f['stdev_ms']:.1f})"
        f" | {f['events_s']:6.0f} events/s | {f['notifications_s']:7.0f} notifications/s"
        f" | {len(results.round_trips_ms)} pongs timed, {results.lost_pongs} late"
        f" | publishing took {statistics.median(results.publish_ms or [0]):.1f} ms (median)"
        f" | ping reached pongers {statistics.median(results.ping_fanout_ms or [0]):.1f} ms,"
        f" pong reached pinger {statistics.median(results.pong_return_ms or [0]):.1f} ms"
        " after its publish began (medians)",
        flush=True,
    )
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.pingpong", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--pongers", type=int, default=50)
    parser.add_argument("--duration", type=float, default=30.0, help="seconds per mode")
    parser.add_argument("--workers", type=int, default=2, help="Celery worker processes")
    parser.add_argument(
        "--threads", type=int, default=8, help="publishing threads per driving process"
    )
    parser.add_argument(
        "--ponger-processes",
        type=int,
        default=0,
        help="driving processes sharing the pongers (0: the pinger's process drives them)",
    )
    parser.add_argument("--depth", type=int, default=2)
    parser.add_argument("--branching", type=int, default=2)
    parser.add_argument("--single", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.single:
        run_single(args)
        return

    env = dict(os.environ)
    env.setdefault("SECRET_KEY", secrets.token_urlsafe(40))
    env.setdefault("LOG_LEVEL", "WARNING")
    started = provide_services(env)
    try:
        print(
            f"ping-pong: 1 pinger, {args.pongers} pongers, {args.duration:g} s per mode, "
            f"tree depth {args.depth} x {args.branching}, {args.workers} worker processes",
            flush=True,
        )
        matching = run_in_child(env, "matching")
        on = describe("matching", matching)
        describe_statements(matching)
        off = describe("blind relay (baseline)", run_in_child(env, "relay"))
        floor = describe("transport floor", run_in_child(env, "floor"))
        for label, baseline in (("blind relay", off), ("floor", floor)):
            rtt_ratio = on["median_ms"] / baseline["median_ms"]
            rate_ratio = on["notifications_s"] / baseline["notifications_s"]
            print(
                f"{'matching / ' + label:>22}: round trip median x{rtt_ratio:.2f},"
                f" notifications/s x{rate_ratio:.2f}"
            )
    finally:
        for server in reversed(started):
            server.stop()


def run_in_child(env: dict[str, str], mode: str) -> Results:
    """Each mode runs in a process of its own: nothing carries over between them."""
    argv = [sys.executable, "-m", "bench.pingpong", "--single", mode, *sys.argv[1:]]
    done = subprocess.run(argv, env=env, cwd=ROOT, check=True, stdout=subprocess.PIPE, text=True)
    return Results(**json.loads(done.stdout.strip().splitlines()[-1]))


def run_single(args) -> None:
    env = dict(os.environ)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    results = run_mode(env, args, args.single)
    print(json.dumps(results.__dict__), flush=True)


if __name__ == "__main__":
    main()
