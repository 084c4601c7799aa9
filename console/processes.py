"""Which of the console's processes run where.

Each process announces itself in Redis every BEAT_S from a thread of its own: its
role, its host, its pid, since when it runs and what it serves (a tree worker's
dispatchers, the reports worker's Spark master), and what it covers for a worker that
is gone (console/takeover.py). An announcement expires after LIVES_S without a beat,
so a process that died, or lost Redis, drops out of the list by itself. The health
page lists them by host (console/views/overview.py).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from django.conf import settings
from redis.exceptions import RedisError

from console.health import redis_client
from reports.reads import running_run

KEY_PREFIX = "sn-processes:"
BEAT_S = 2.0
LIVES_S = 30.0  # a process busy for a few seconds is not forgotten
# Late beyond this: shown so, and a tree worker this late is taken for gone (its
# dispatchers are taken over, console/takeover.py). Three beats: one missed beat of a
# busy process is not enough.
LATE_AFTER_S = 3 * BEAT_S
logger = logging.getLogger(__name__)


class Role:
    """The kinds of process (docs/deploy.md lays them out over hosts)."""

    WEB = "web"
    TREE_WORKER = "tree worker"
    REPORTS_WORKER = "reports worker"
    BEAT = "beat"
    ORDER = (WEB, TREE_WORKER, REPORTS_WORKER, BEAT)


@dataclass(frozen=True)
class Announcement:
    """One process as it last announced itself."""

    role: str
    host: str
    pid: int
    started_at: float  # Unix time
    beat_at: float
    serves: list[str] = field(default_factory=list)
    covers: list[str] = field(default_factory=list)  # a gone worker's, for now

    def age_s(self, now: float) -> float:
        """Seconds since its last beat."""
        return max(0.0, now - self.beat_at)

    def is_late(self, now: float) -> bool:
        """Whether it missed its beats: shown late, and taken for gone."""
        return self.age_s(now) > LATE_AFTER_S


_withdrawn = threading.Event()


def announce_forever(
    role: str,
    *,
    serves: list[str] | None = None,
    covering: Callable[[], list[str]] | None = None,
) -> threading.Thread:
    """Announce this process now and every BEAT_S, on a daemon thread, until it ends or
    withdraws; `covering` tells, at each beat, what it covers for a worker gone."""
    started_at = time.time()

    def beat_forever() -> None:
        client = redis_client()
        while not _withdrawn.is_set():
            covers = covering() if covering else []
            _write(client, _record(role, started_at, serves or [], covers))
            _withdrawn.wait(BEAT_S)

    thread = threading.Thread(target=beat_forever, name=f"announce-{role}", daemon=True)
    thread.start()
    return thread


def withdraw() -> None:
    """Stop announcing this process and remove its announcement: a tree worker that
    stops on purpose has its dispatchers taken over at once, not after LATE_AFTER_S."""
    _withdrawn.set()
    try:
        redis_client().delete(_key(settings.HOST_NAME, os.getpid()))
    except RedisError:
        logger.debug("withdrawing the announcement failed", exc_info=True)


def _key(host: str, pid: int | str) -> str:
    return f"{KEY_PREFIX}{host}:{pid}"


def _record(role: str, started_at: float, serves: list[str], covers: list[str]) -> dict:
    return {
        "role": role,
        "host": settings.HOST_NAME,
        "pid": str(os.getpid()),
        "started_at": repr(started_at),
        "beat_at": repr(time.time()),
        "serves": json.dumps(serves),
        "covers": json.dumps(covers),
    }


def _write(client, record: dict[str, str]) -> None:
    """One beat; with Redis down it is skipped (the outage is told elsewhere, once)."""
    key = _key(record["host"], record["pid"])
    try:
        pipeline = client.pipeline(transaction=True)
        pipeline.hset(key, mapping=record)
        pipeline.expire(key, int(LIVES_S))
        pipeline.execute()
    except Exception:
        logger.debug("announcing %s failed", key, exc_info=True)


def announce_once(
    role: str, *, serves: list[str] | None = None, covers: list[str] | None = None
) -> None:
    """One announcement of this process, now (a test's, or a short-lived process's)."""
    _write(redis_client(), _record(role, time.time(), serves or [], covers or []))


def announced() -> list[Announcement]:
    """Every live announcement, by host, then role (in Role.ORDER), then pid."""
    client = redis_client()
    keys = list(client.scan_iter(f"{KEY_PREFIX}*", count=500))
    pipeline = client.pipeline(transaction=False)
    for key in keys:
        pipeline.hgetall(key)
    found = [_announcement(raw) for raw in pipeline.execute() if raw]
    return sorted(found, key=_display_order)


def _announcement(raw: dict[bytes, bytes]) -> Announcement:
    values = {name.decode(): value.decode() for name, value in raw.items()}
    return Announcement(
        role=values.get("role", "?"),
        host=values.get("host", "?"),
        pid=int(values.get("pid", 0)),
        started_at=float(values.get("started_at", 0)),
        beat_at=float(values.get("beat_at", 0)),
        serves=json.loads(values.get("serves", "[]")),
        covers=json.loads(values.get("covers", "[]")),
    )


def _display_order(announcement: Announcement) -> tuple:
    rank = Role.ORDER.index(announcement.role) if announcement.role in Role.ORDER else 99
    return (announcement.host, rank, announcement.pid)


def by_host(announcements: list[Announcement]) -> dict[str, list[Announcement]]:
    """The announcements grouped by host, in the order given."""
    hosts: dict[str, list[Announcement]] = {}
    for announcement in announcements:
        hosts.setdefault(announcement.host, []).append(announcement)
    return hosts


def beats_running(announcements: list[Announcement]) -> int:
    """How many beats announce themselves: more than one runs every schedule twice."""
    return sum(1 for announcement in announcements if announcement.role == Role.BEAT)


@dataclass(frozen=True)
class ProcessRow:
    """A process as the health page shows it."""

    role: str
    pid: int
    beat_age_s: float
    late: bool
    serves: str
    detail: str


@dataclass(frozen=True)
class Processes:
    """The console's processes by host, or why they are unknown."""

    by_host: dict[str, list[ProcessRow]]
    beats: int
    unknown: str = ""  # why the list could not be read


def processes_now() -> Processes:
    """Every announced process by host (console/processes.py), with the reports
    worker judged by its run's heartbeat while it runs one."""
    try:
        found = announced()
    except RedisError as error:
        return Processes({}, 0, unknown=f"Redis cannot be reached ({error})")
    now = time.time()
    rows = {host: [_row(a, now) for a in ones] for host, ones in by_host(found).items()}
    return Processes(rows, beats_running(found))


def _row(announcement: Announcement, now: float) -> ProcessRow:
    """The process's row; the reports worker, while it runs a report, is judged by the
    run's heartbeat too (its Spark job holds it busy, and the run tells how it goes)."""
    age_s, detail = announcement.age_s(now), ""
    if announcement.covers:
        covered = ", ".join(announcement.covers)
        detail = f"also serving {covered}: no live tree worker serves them"
    if announcement.role == Role.REPORTS_WORKER:
        run_age_s, detail = _running_report(now)
        age_s = min(age_s, run_age_s)
    return ProcessRow(
        role=announcement.role,
        pid=announcement.pid,
        beat_age_s=age_s,
        late=age_s > LATE_AFTER_S,  # the reports worker's age may be its run's
        serves=", ".join(announcement.serves),
        detail=detail,
    )


def _running_report(now: float) -> tuple[float, str]:
    """(seconds since the running run's heartbeat, what the worker is doing)."""
    run = running_run()
    beat = run and (run.heartbeat_at or run.started_at)
    if run is None or beat is None:
        return float("inf"), "idle"
    age_s = max(0.0, now - beat.timestamp())
    return age_s, f"running the {run.kind} report (run {run.pk}, its heartbeat {age_s:.0f} s ago)"
