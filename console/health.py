"""Health checks: each real dependency is exercised with a round trip and timed.

Used by the /healthz page (logged in: every check's latency and detail) and
/healthz.json (anyone, monitors and the launcher: each check up or down, nothing more).
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

import redis
from asgiref.sync import async_to_sync
from celery import current_app
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import connection
from redis.backoff import NoBackoff
from redis.retry import Retry

from lifecycle.reads import transaction_counter

WORKER_ECHO_PREFIX = "sn-health:worker-echo:"
POLL_INTERVAL_S = 0.02


@dataclass(frozen=True)
class CheckResult:
    """The outcome of one health check, with its latency in milliseconds."""

    name: str
    ok: bool
    latency_ms: float
    detail: str

    def public(self) -> dict:
        """What anyone may know of this check: its name and whether it passed. Its
        detail names server versions and its errors name hosts, sockets and users."""
        return {"name": self.name, "ok": self.ok}


def public_health(checks: list[CheckResult]) -> dict:
    """The answer of /healthz.json: up or down overall and per check, by name."""
    return {"ok": all(check.ok for check in checks), "checks": [c.public() for c in checks]}


def redis_client() -> redis.Redis:
    """A short-lived client for the configured Redis, with tight time-outs and no
    retries: redis-py retries a refused connection for seconds by default, and a check
    reports what is true now (while Redis is down, the page still answers at once)."""
    timeout_s = settings.HEALTH_CHECK_TIMEOUT_S
    return redis.Redis.from_url(
        settings.REDIS_URL,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        retry=Retry(NoBackoff(), 0),
    )


def timed_check(name: str, probe: Callable[[], str]) -> CheckResult:
    """Run `probe`, timing it; any exception becomes a failed check with its message."""
    started = time.perf_counter()
    try:
        detail = probe()
        ok = True
    except Exception as error:  # a health check reports every failure, whatever it is
        detail = f"{type(error).__name__}: {error}"
        ok = False
    return CheckResult(name, ok, (time.perf_counter() - started) * 1000, detail)


def probe_database() -> str:
    """The server's version; a failure when its transaction counter is behind the rows
    it holds (restored from a logical dump and not yet moved: the tree, the reports'
    export and the audit chain would each miss what is written from then on)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT version()")
        version = cursor.fetchone()[0]
    counter = transaction_counter(thorough=False)
    if counter.behind:
        raise RuntimeError(
            f"the transaction counter ({counter.next_value}) is behind the stored rows'"
            f" ({counter.needed}, {counter.needed_by}): restored from a logical dump"
            " and not moved; run manage.py after_restore (docs/operations.md)"
        )
    return version.split(" on ")[0]


def probe_redis() -> str:
    client = redis_client()
    client.ping()
    return f"Redis {client.info('server')['redis_version']}"


def probe_channel_layer() -> str:
    layer = get_channel_layer()
    return async_to_sync(_bounded_round_trip)(layer)


async def _bounded_round_trip(layer) -> str:
    # The whole round trip is bounded, not just the receive: a send may wait for a free
    # pooled connection or for an unreachable host for much longer.
    timeout_s = settings.HEALTH_CHECK_TIMEOUT_S
    try:
        return await asyncio.wait_for(_channel_layer_round_trip(layer), timeout_s)
    except TimeoutError:
        raise TimeoutError(f"no send/receive round trip within {timeout_s:g} s") from None


async def _channel_layer_round_trip(layer) -> str:
    # The default prefix: channels_redis reads every channel of a process from one key
    # per prefix, under one lock, so a channel of another prefix would wait forever
    # whenever a consumer of this process is already receiving.
    channel = await layer.new_channel()
    token = secrets.token_hex(8)
    await layer.send(channel, {"type": "health.ping", "token": token})
    message = await layer.receive(channel)
    if message.get("token") != token:
        raise RuntimeError("the channel layer returned a different message")
    return f"{type(layer).__name__} send/receive"


# The Celery task that answers the worker check (console.tasks.health_echo).
ECHO_TASK = "console.health_echo"


def record_worker_echo(token: str) -> None:
    """Called by the worker's task: leave a short-lived mark the web side polls for."""
    redis_client().set(WORKER_ECHO_PREFIX + token, "1", ex=60)


def probe_celery_worker(*, queue: str | None = None, timeout_s: float | None = None) -> str:
    """Enqueue an echo task and wait until a worker has run it."""
    timeout_s = timeout_s or settings.HEALTH_CHECK_TIMEOUT_S
    token = secrets.token_hex(8)
    client = redis_client()
    # One immediate retry (a pooled connection may be stale after a Redis restart),
    # not the default's waits: with the broker down, the check says so now.
    # By name: the task's module (console.tasks) builds on this one.
    current_app.send_task(
        ECHO_TASK,
        args=[token],
        queue=queue or settings.CELERY_TASK_DEFAULT_QUEUE,
        retry_policy={"max_retries": 1, "interval_start": 0, "interval_step": 0},
    )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if client.delete(WORKER_ECHO_PREFIX + token):
            return "a worker ran the echo task"
        time.sleep(POLL_INTERVAL_S)
    raise TimeoutError(f"no worker ran the echo task within {timeout_s:g} s")


def run_all_checks() -> list[CheckResult]:
    """Run every check, in the order the page shows them."""
    return [
        timed_check("database", probe_database),
        timed_check("redis", probe_redis),
        timed_check("celery worker", probe_celery_worker),
        timed_check("channel layer", probe_channel_layer),
    ]
