"""Redis outages, told once.

Redis carries the channel layer (pushes to agents and consoles), the hops between
dispatchers and Celery's queues. When it stops, every process that uses it fails in
many places at once and retries on its own (the layer's reader, the hop consumers,
Celery's consumer and beat, the announcements to consoles, a login's group join), and
each failure used to be logged with its traceback: hundreds of them for a restart that
loses nothing. An expected outage is one warning line per process; a failure that is
not an outage is logged as before.
"""

from __future__ import annotations

import logging
import threading
import time

from kombu.exceptions import OperationalError as BrokerConnectionError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

# What Redis being down (refusing, resetting, still loading its data) raises: redis-py's
# own errors, and kombu's wrapping of them for Celery.
OUTAGE_ERRORS = (RedisConnectionError, RedisTimeoutError, BrokerConnectionError)
# What Celery logs of an outage without an exception: its consumer's and beat's
# reconnection attempts, and each task it ends because it can no longer acknowledge it
# (the task is delivered again: CELERY_TASK_ACKS_LATE).
CELERY_OUTAGE_LINES = (
    "Cannot connect to redis",
    "Connection to broker lost",
    "beat: Connection error",
    "cannot be acknowledged after a connection loss",
)


def is_outage(error: BaseException | None) -> bool:
    """Whether `error`, or an error it was raised from or while handling, is Redis
    being unreachable."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, OUTAGE_ERRORS):
            return True
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return False


def first_line(error: BaseException) -> str:
    """The outage as Redis's client said it, on one line."""
    while not isinstance(error, OUTAGE_ERRORS) and (error.__cause__ or error.__context__):
        error = error.__cause__ or error.__context__
    return (str(error).splitlines() or [type(error).__name__])[0]


class OneLinePerOutage(logging.Filter):
    """A logging filter: of the records an outage causes in this process, the first
    becomes one warning line without its traceback, and the others are dropped; an
    outage that goes on is told again every REMIND_S. It is over when none has come for
    QUIET_S: the next one is a new outage."""

    QUIET_S = 60.0
    REMIND_S = 300.0

    def __init__(self, name: str = "") -> None:
        super().__init__(name)
        self._lock = threading.Lock()
        self._last_seen = self._started = self._told_at = -self.QUIET_S  # time.monotonic()

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if not is_outage(error) and not _celery_tells_an_outage(record):
            return True
        with self._lock:
            now = time.monotonic()
            if now - self._last_seen >= self.QUIET_S:
                self._started = self._told_at = now
                told = "Redis cannot be reached"
            elif now - self._told_at >= self.REMIND_S:
                self._told_at = now
                told = f"Redis still cannot be reached after {now - self._started:.0f} s"
            else:
                told = None
            self._last_seen = now
        if told is not None:
            _as_one_line(record, told, error)
        return told is not None


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
