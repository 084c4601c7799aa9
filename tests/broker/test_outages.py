"""A Redis outage told once per process (broker.push.outages), and everything else
logged as it was."""

from __future__ import annotations

import logging

import psycopg
import pytest
from django.db.utils import OperationalError as DjangoOperationalError
from kombu.exceptions import OperationalError
from psycopg import errors as pg_errors
from redis.exceptions import BusyLoadingError
from redis.exceptions import ConnectionError as RedisConnectionError

from broker.push import outages
from broker.push.outages import OneLinePerOutage, is_outage, server_down

REFUSED = "Error 111 connecting to /var/redis.sock. Connection refused."


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(outages.time, "monotonic", clock)
    return clock


def record(error: BaseException | None, message: str = "it failed", *, name: str = "broker"):
    exc_info = (type(error), error, error.__traceback__) if error is not None else None
    return logging.LogRecord(name, logging.ERROR, __file__, 1, message, (), exc_info)


def raised_from(cause: BaseException) -> RuntimeError:
    try:
        try:
            raise cause
        except BaseException as error:
            raise RuntimeError("on_commit failed") from error
    except RuntimeError as outer:
        return outer


def test_redis_unreachable_is_an_outage_even_when_wrapped_but_other_failures_are_not():
    assert is_outage(RedisConnectionError(REFUSED))
    assert is_outage(BusyLoadingError("Redis is loading the dataset in memory"))
    assert is_outage(OperationalError(REFUSED))  # kombu's, for Celery
    assert is_outage(raised_from(RedisConnectionError(REFUSED)))
    assert not is_outage(ConnectionRefusedError(111, "refused"))  # whose? not told
    assert not is_outage(raised_from(ValueError("a bug")))
    assert not is_outage(None)


def test_postgresql_unreachable_is_an_outage_but_a_deadlock_or_a_bad_query_is_not():
    broken = psycopg.OperationalError("connection is bad: no such file or directory")
    assert server_down(raised_from(broken)) == "PostgreSQL"
    assert server_down(pg_errors.AdminShutdown("terminating connection")) == "PostgreSQL"
    assert server_down(RedisConnectionError(REFUSED)) == "Redis"
    wrapped = DjangoOperationalError("connection failed")
    wrapped.__cause__ = psycopg.OperationalError("connection failed: the database is starting")
    assert server_down(wrapped) == "PostgreSQL"
    assert not is_outage(pg_errors.DeadlockDetected("deadlock detected"))
    assert not is_outage(pg_errors.UndefinedColumn("column x does not exist"))


def test_the_first_failure_of_an_outage_is_one_warning_line_and_the_rest_are_dropped(clock):
    tell = OneLinePerOutage()
    first = record(raised_from(RedisConnectionError(REFUSED)), "Error calling lambda")
    assert tell.filter(first)
    assert first.levelno == logging.WARNING and first.exc_info is None
    assert first.getMessage().startswith(f"Redis cannot be reached ({REFUSED})")
    clock.now += 5
    assert not tell.filter(record(RedisConnectionError(REFUSED)))
    retrying = record(None, "consumer: Cannot connect to redis://cache:6379//", name="celery")
    assert not tell.filter(retrying)


def test_each_server_has_its_own_outage_line(clock):
    tell = OneLinePerOutage()
    assert tell.filter(record(RedisConnectionError(REFUSED)))
    down = record(raised_from(psycopg.OperationalError("connection failed: shutting down")))
    assert tell.filter(down)
    assert down.getMessage().startswith("PostgreSQL cannot be reached (connection failed")
    assert not tell.filter(record(pg_errors.AdminShutdown("terminating connection")))


def test_a_failure_that_is_not_an_outage_keeps_its_traceback_during_one(clock):
    tell = OneLinePerOutage()
    assert tell.filter(record(RedisConnectionError(REFUSED)))
    bug = record(ValueError("a bug"))
    assert tell.filter(bug)
    assert bug.exc_info is not None and bug.levelno == logging.ERROR


def test_a_long_outage_is_told_again_every_few_minutes_and_a_new_one_after_a_quiet_minute(
    clock,
):
    tell = OneLinePerOutage()
    assert tell.filter(record(RedisConnectionError(REFUSED)))
    for _ in range(int(OneLinePerOutage.REMIND_S // 10) - 1):
        clock.now += 10
        assert not tell.filter(record(RedisConnectionError(REFUSED)))
    clock.now += 10
    reminder = record(RedisConnectionError(REFUSED))
    assert tell.filter(reminder)
    assert reminder.getMessage().startswith("Redis still cannot be reached after 300 s")
    clock.now += OneLinePerOutage.QUIET_S  # a minute without a failure: over
    again = record(RedisConnectionError(REFUSED))
    assert tell.filter(again)
    assert again.getMessage().startswith("Redis cannot be reached")


def test_celerys_reconnection_messages_are_the_outage_too_but_not_other_celery_lines(clock):
    tell = OneLinePerOutage()
    retrying = record(None, "consumer: Cannot connect to %s: %s.", name="celery.worker.consumer")
    retrying.args = ("redis+socket:///var/redis.sock", REFUSED)
    assert tell.filter(retrying)
    assert retrying.getMessage().startswith("Redis cannot be reached (consumer: Cannot connect")
    ended = "Task t[1] cannot be acknowledged after a connection loss since late ..."
    assert not tell.filter(record(None, ended, name="celery.worker.consumer"))
    beat = record(None, "beat: Connection error: refused. Trying again", name="celery.beat")
    assert not tell.filter(beat)
    other = record(None, "celery@host ready.", name="celery.apps.worker")
    assert tell.filter(other) and other.getMessage() == "celery@host ready."
