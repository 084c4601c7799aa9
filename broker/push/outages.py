"""Outages of Redis and PostgreSQL, told once.

Redis carries the channel layer (pushes to agents and consoles), the hops between
dispatchers and Celery's queues; PostgreSQL holds everything else. When either stops,
every process that uses it fails in many places at once and retries on its own (the
layer's reader, the hop consumers, Celery's consumer and beat, the announcements to
consoles, the agents' frames), and each failure used to be logged with its traceback:
hundreds of them for a restart that loses nothing. An expected outage is one warning
line per server and process; a failure that is not an outage is logged as before.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator

import psycopg
from kombu.exceptions import OperationalError as BrokerConnectionError
from psycopg import errors as pg_errors
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

REDIS, POSTGRESQL = "Redis", "PostgreSQL"
# What Redis being down (refusing, resetting, still loading its data) raises: redis-py's
# own errors, and kombu's wrapping of them for Celery.
REDIS_DOWN = (RedisConnectionError, RedisTimeoutError, BrokerConnectionError)
# PostgreSQL being down: a connection that failed or broke (psycopg's OperationalError
# itself, not its subclasses such as a deadlock), the server shutting down, starting,
# or a connection-class error (SQLSTATE 08).
POSTGRESQL_DOWN = (
    pg_errors.AdminShutdown, pg_errors.CrashShutdown, pg_errors.CannotConnectNow,
    pg_errors.ConnectionException,
)  # fmt: skip
# What Celery logs of a Redis outage without an exception: its consumer's and beat's
# reconnection attempts, and each task it ends because it can no longer acknowledge it
# (the task is delivered again: CELERY_TASK_ACKS_LATE).
CELERY_OUTAGE_LINES = (
    "Cannot connect to redis",
    "Connection to broker lost",
    "beat: Connection error",
    "cannot be acknowledged after a connection loss",
)


def server_down(error: BaseException | None) -> str | None:
    """REDIS or POSTGRESQL when `error`, or an error it was raised from or while
    handling, is that server being unreachable; else None."""
    return next((server for link in _chain(error) if (server := _down(link))), None)


def _down(error: BaseException) -> str | None:
    """The server whose being unreachable `error` itself says, if any."""
    if isinstance(error, REDIS_DOWN):
        return REDIS
    if type(error) is psycopg.OperationalError or isinstance(error, POSTGRESQL_DOWN):
        return POSTGRESQL
    return None


def is_outage(error: BaseException | None) -> bool:
    """Whether `error` comes of Redis or PostgreSQL being unreachable."""
    return server_down(error) is not None


def first_line(error: BaseException) -> str:
    """The outage as the server's client said it, on one line."""
    links = list(_chain(error))
    told = next((link for link in links if _down(link)), links[-1])
    return (str(told).splitlines() or [type(told).__name__])[0]


def _chain(error: BaseException | None) -> Iterator[BaseException]:
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        yield error
        seen.add(id(error))
        error = error.__cause__ or error.__context__


class OneLinePerOutage(logging.Filter):
    """A logging filter: of the records an outage of a server causes in this process,
    the first becomes one warning line without its traceback, and the others are
    dropped; an outage that goes on is told again every REMIND_S. It is over when none
    has come for QUIET_S: the next one is a new outage. Each server has its own."""

    QUIET_S = 60.0
    REMIND_S = 300.0

    def __init__(self, name: str = "") -> None:
        super().__init__(name)
        self._lock = threading.Lock()
        self._outages: dict[str, _Outage] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        server = server_down(error) or (REDIS if _celery_tells_an_outage(record) else None)
        if server is None:
            return True
        with self._lock:
            outage = self._outages.setdefault(server, _Outage())
            told = outage.tell(server, time.monotonic(), self.QUIET_S, self.REMIND_S)
        if told is not None:
            _as_one_line(record, told, error)
        return told is not None


class _Outage:
    """When the records of one server's outage came, and when it was last told."""

    def __init__(self) -> None:
        self.last_seen = self.started = self.told_at = float("-inf")

    def tell(self, server: str, now: float, quiet_s: float, remind_s: float) -> str | None:
        """What to say of a record that comes `now`, or None to drop it."""
        told = None
        if now - self.last_seen >= quiet_s:
            self.started = self.told_at = now
            told = f"{server} cannot be reached"
        elif now - self.told_at >= remind_s:
            self.told_at = now
            told = f"{server} still cannot be reached after {now - self.started:.0f} s"
        self.last_seen = now
        return told


def _celery_tells_an_outage(record: logging.LogRecord) -> bool:
    if not record.name.startswith("celery"):
        return False
    message = record.getMessage()
    return any(phrase in message for phrase in CELERY_OUTAGE_LINES)


def _as_one_line(record: logging.LogRecord, told: str, error: BaseException | None) -> None:
    cause = first_line(error) if error is not None else record.getMessage().splitlines()[0]
    record.msg = "%s (%s); this process retries on its own and says no more of it for a while"
    record.args = (told, cause)
    record.levelno, record.levelname = logging.WARNING, "WARNING"
    record.exc_info = record.exc_text = record.stack_info = None


_ONE_PER_PROCESS = OneLinePerOutage()


def one_line_per_outage() -> OneLinePerOutage:
    """The process's filter (settings.LOGGING): one per process, so that an outage is
    one line whichever logger tells it."""
    return _ONE_PER_PROCESS


def quiet_uvicorn_about_outages() -> None:
    """Uvicorn logs an application's failures through handlers of its own, which the
    settings' filter does not reach: the same filter on its error logger."""
    uvicorn_errors = logging.getLogger("uvicorn.error")
    if _ONE_PER_PROCESS not in uvicorn_errors.filters:
        uvicorn_errors.addFilter(_ONE_PER_PROCESS)
