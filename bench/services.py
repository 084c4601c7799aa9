"""What the benchmarks share: private PostgreSQL and Redis, a fresh database per run,
Celery workers for the whole tree, and waiting for the tree to go quiet."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def start_process(argv: list[str], env: dict[str, str], **options) -> subprocess.Popen:
    """A process of the stack under test, in its own session (so that the bench can
    signal it with its children), which dies with the bench however the bench ends."""
    from launcher.supervisor import die_with_parent

    return subprocess.Popen(
        argv, env=env, cwd=ROOT, start_new_session=True, preexec_fn=die_with_parent, **options
    )


def stop_on_sigterm() -> None:
    """SIGTERM ends the bench as Ctrl-C does: through its `finally` blocks, which stop
    every process and private server it started (a plain SIGTERM would leave them)."""

    def interrupt(signum, frame) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)


def start_fleet(
    env: dict[str, str],
    *,
    port: int,
    agents: int,
    processes: int,
    load_interval_s: float,
    stats_dir: str,
    reports: list[dict] | None = None,
    light: bool = False,
    **output,
) -> subprocess.Popen:
    """The fleet simulator's agents against the console on `port` (the real agents, or
    with `light` the light fleet), returned once every agent has logged in and
    advertised its model (each process says so in a JSON line, with how long its logins
    and its whole start took: added to `reports`)."""
    argv = [
        sys.executable,
        str(ROOT / "manage.py"),
        "simulate_fleet",
        "--agents",
        str(agents),
        "--processes",
        str(processes),
        "--url",
        f"ws://127.0.0.1:{port}/ws/agent/v1/",
        "--load-interval",
        str(load_interval_s),
        "--stats-dir",
        stats_dir,
        *(["--light"] if light else []),
    ]
    fleet = start_process(argv, env, stdout=subprocess.PIPE, text=True, **output)
    ready = 0
    while ready < agents:
        line = fleet.stdout.readline()
        if not line:
            raise RuntimeError("the fleet simulator stopped before its agents were ready")
        if line.startswith("{"):
            report = json.loads(line)
            ready += report["ready"]
            if reports is not None:
                reports.append(report)
    return fleet


def fleet_stats(stats_dir: str) -> list[dict]:
    """What each fleet process wrote when it stopped (demo/simulator.py)."""
    return [json.loads(p.read_text()) for p in Path(stats_dir).glob("fleet-stats-*.json")]


def cpu_seconds(pids: list[int], *, children: bool = True) -> float:
    """CPU time (user + system, all threads) of these processes and, with `children`,
    of their descendants, gone ones included (a process's waited-for children count in
    its own figures), as Linux's /proc has it."""
    return _cpu_seconds_in(_proc_stats(), pids, children=children)


def cpu_seconds_each(pids: list[int], *, children: bool = True) -> dict[int, float]:
    """`cpu_seconds` of each of `pids` that is still there (a zombie included), from
    one reading of /proc."""
    stats = _proc_stats()
    return {pid: _cpu_seconds_in(stats, [pid], children=children) for pid in pids if pid in stats}


def _cpu_seconds_in(stats: dict, pids: list[int], *, children: bool) -> float:
    tick = os.sysconf("SC_CLK_TCK")
    wanted, total = set(pids), 0.0
    while wanted:
        total += sum(stats[pid][1 if children else 2] for pid in wanted if pid in stats) / tick
        if not children:
            break
        wanted = {pid for pid, (ppid, _, _) in stats.items() if ppid in wanted}
    return total


def _proc_stats() -> dict[int, tuple[int, int, int]]:
    """{pid: (parent pid, ticks with its waited-for children, ticks of its own)}."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                text = (entry / "stat").read_text()
                fields = [int(f) for f in text.rsplit(")", 1)[1].split()[1:15]]
            except (OSError, ValueError):
                continue
            own = fields[10] + fields[11]
            found[int(entry.name)] = (fields[0], own + fields[12] + fields[13], own)
    return found


def provide_services(env: dict[str, str], folder: Path = ROOT / "var" / "bench") -> list:
    """Private PostgreSQL and Redis for the benchmark, their data in `folder`, unless
    URLs are given."""
    from launcher.embedded import EmbeddedPostgres, EmbeddedRedis

    started = []
    if not env.get("DATABASE_URL"):
        postgres = EmbeddedPostgres(folder / "postgres")
        postgres.start()
        started.append(postgres)
        env["DATABASE_URL"] = postgres.url("bench")
    if not env.get("REDIS_URL"):
        redis_server = EmbeddedRedis(folder / "redis")
        redis_server.start()
        started.append(redis_server)
        env["REDIS_URL"] = redis_server.url()
        import redis

        # Our own private server: leftovers of an earlier run must not be measured.
        redis.Redis.from_url(env["REDIS_URL"]).flushdb()
    return started


def fresh_database(env: dict[str, str], *, keep: bool = False) -> bool:
    """Drop and create the benchmark's database, then migrate it; with `keep`, create
    it only if it is missing and keep its rows (a bench that reuses what it loaded).
    Whether it was made anew (what was kept for the old one is of no use now)."""
    from urllib.parse import urlsplit, urlunsplit

    import psycopg

    parts = urlsplit(env["DATABASE_URL"])
    name = parts.path.lstrip("/")
    admin_url = urlunsplit(parts._replace(path="/postgres"))
    with psycopg.connect(admin_url, autocommit=True) as connection:
        found = connection.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name])
        made = not (keep and found.fetchone())
        if made:
            connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            connection.execute(f'CREATE DATABASE "{name}"')
    manage = [sys.executable, str(ROOT / "manage.py")]
    subprocess.run([*manage, "migrate", "-v", "0"], env=env, check=True)
    return made


def tree_queues() -> list[str]:
    """The default queue and every dispatcher's queue, as the database has them."""
    from django.conf import settings

    from broker.models import Dispatcher

    return [settings.CELERY_TASK_DEFAULT_QUEUE] + [d.queue for d in Dispatcher.objects.all()]


def worker_argv(name: str) -> list[str]:
    """A Celery worker serving the whole tree, one process (BENCH_POOL picks the pool)."""
    celery = str(Path(sys.executable).parent / "celery")
    return [
        celery, "-A", "console", "worker", "--loglevel", "ERROR",
        "--pool", os.environ.get("BENCH_POOL", "solo"), "--concurrency", "1",
        "--without-gossip", "--without-mingle", "--without-heartbeat",
        "--hostname", f"{name}-{secrets.token_hex(3)}@%h", "--queues", ",".join(tree_queues()),
    ]  # fmt: skip


def wait_for_tree_idle(timeout_s: float, *, at_most: int = 0) -> None:
    """Until no tree work is queued, running or waiting in an inbox (or no more than
    `at_most` pieces: a connected fleet's steady reports keep a pass per leaf coming),
    five checks running."""
    from broker.dispatch.backlog import pending_tree_work

    queues = tree_queues()
    deadline, quiet = time.monotonic() + timeout_s, 0
    while time.monotonic() < deadline and quiet < 5:
        quiet = quiet + 1 if pending_tree_work(queues) <= at_most else 0
        time.sleep(0.1)


def run_in_process(run, args, folder: Path) -> None:
    """Run a page bench (`run(args, env)`, answering whether it held its budgets) in
    this process against private services kept in `folder`; exit 1 if it did not."""
    env = dict(os.environ)
    env.setdefault("SECRET_KEY", secrets.token_urlsafe(40))
    env.setdefault("LOG_LEVEL", "WARNING")
    env.setdefault("STATIC_ROOT", str(folder / "static"))
    started = provide_services(env, folder)
    try:
        ok = run(args, env)
    finally:
        for server in reversed(started):
            server.stop()
    sys.exit(0 if ok else 1)


def logged_in_web_client(user, **defaults):
    """Django's test client logged in as `user` with their second factor proved (a
    bench authenticator is made for them), as a person who typed a code just now."""
    from django.test import Client
    from django_otp import DEVICE_ID_SESSION_KEY
    from django_otp.plugins.otp_totp.models import TOTPDevice

    from console.access import CODE_TYPED_AT

    device, _ = TOTPDevice.objects.get_or_create(user=user, name="bench", confirmed=True)
    client = Client(**defaults)
    client.force_login(user)
    session = client.session
    session[DEVICE_ID_SESSION_KEY] = device.persistent_id
    session[CODE_TYPED_AT] = time.time()
    session.save()
    return client
