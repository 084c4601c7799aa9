"""The tables partitioned by day, and their partitions made ahead and dropped.

Migration 0026 of `broker` partitioned them (broker/migrations/_partitioning.py, a
frozen copy of the names and ranges used here): table `T` partitioned by `KEY` has a
partition `T_pYYYYMMDD` for the UTC day of KEY and `T_default` for rows no day
partition holds yet. The beat makes the days ahead (`ensure_partitions`), so that the
default stays empty; rows found in it (the beat was stopped for a long time) are moved
into the day partition made for them.

Attaching a partition takes a lock on the parent that reads and writes pass
(SHARE UPDATE EXCLUSIVE); detaching one with a default partition beside it needs the
parent to itself, for the moment it takes: asked for with a short lock time-out and
tried again, so that a send never waits behind a long query and the drop.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from django.db import OperationalError, connection, transaction
from django.utils import timezone
from psycopg import sql

AHEAD_DAYS = 14
# One process at a time makes or drops partitions (the beat, retention, a loader):
# PostgreSQL advisory lock namespace and key, held by the session.
PARTITIONS_LOCK = (7_103, 1)
LOCK_TIMEOUT_MS = 500
LOCK_ATTEMPTS = 20
DAY_SUFFIX = re.compile(r"_p(\d{8})$")


@dataclass(frozen=True)
class PartitionedTable:
    """A table partitioned by the day of `key`, the retention group it is in, the
    reports' dataset table it is exported as (None: it is not), and whether its rows
    belong to events (`event_id`)."""

    table: str
    key: str
    group: str
    exported_as: str | None = None
    of_events: bool = False

    def partition(self, day: date) -> str:
        """The name of the partition holding the rows of `day`."""
        return f"{self.table}_p{day:%Y%m%d}"

    @property
    def default(self) -> str:
        return f"{self.table}_default"


DELIVERIES = PartitionedTable("broker_delivery", "expires_at", "deliveries", "deliveries", True)
TRAFFIC = PartitionedTable("broker_trafficrecord", "at", "traffic", "hops", True)
CLIENT_CHANGES = PartitionedTable("broker_clientchange", "at", "changes")
ATTRIBUTE_HISTORY = PartitionedTable(
    "broker_attributehistory", "at", "attributes", "attribute_history"
)
PARTITIONED = (DELIVERIES, TRAFFIC, CLIENT_CHANGES, ATTRIBUTE_HISTORY)


def composed(template: str, **names: sql.Composable) -> str:
    """`template` with identifiers quoted in, as text (Django's cursors log text)."""
    connection.ensure_connection()  # quoting asks the connection for its encoding
    return sql.SQL(template).format(**names).as_string(connection.connection)


def today() -> date:
    """The current UTC day (partitions are cut at midnight UTC)."""
    return timezone.now().astimezone(UTC).date()


def day_start(day: date) -> datetime:
    """The first moment of `day`, UTC."""
    return datetime(day.year, day.month, day.day, tzinfo=UTC)


def days_of(table: PartitionedTable) -> list[date]:
    """The days `table` has a partition for, oldest first."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
            " WHERE i.inhparent = %s::regclass",
            [table.table],
        )
        names = [name for (name,) in cursor.fetchall()]
    found = (DAY_SUFFIX.search(name) for name in names)
    return sorted(datetime.strptime(m.group(1), "%Y%m%d").date() for m in found if m)


def ensure_partitions(*, first: date | None = None, last: date | None = None) -> list[str]:
    """Make every table's partitions from `first` (yesterday) to `last` (AHEAD_DAYS
    from today), and one for each day rows wait for in a default partition. Returns
    the partitions made. Idempotent; safe beside writers."""
    first = first or today() - timedelta(days=1)
    last = last or today() + timedelta(days=AHEAD_DAYS)
    wanted = {first + timedelta(days=n) for n in range((last - first).days + 1)}
    made = []
    with partitions_held():
        for table in PARTITIONED:
            have = set(days_of(table))
            for day in sorted((wanted | set(_days_in_default(table))) - have):
                _attach_day(table, day)
                made.append(table.partition(day))
    return made


def ensure_day(table: PartitionedTable, day: date) -> None:
    """Make `day`'s partition of `table` unless it has one (a day in the past that no
    row was written on, before rows are written there). Hold `partitions_held`."""
    if day not in days_of(table):
        _attach_day(table, day)


@contextmanager
def partitions_held() -> Iterator[None]:
    """Hold the right to make and drop partitions (PARTITIONS_LOCK) for the block,
    waiting for whoever holds it: what the block reads of them is then true for it."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_lock(%s, %s)", PARTITIONS_LOCK)
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s, %s)", PARTITIONS_LOCK)


def _days_in_default(table: PartitionedTable) -> list[date]:
    with connection.cursor() as cursor:
        cursor.execute(
            composed(
                "SELECT DISTINCT ({key} AT TIME ZONE 'UTC')::date FROM {default}",
                key=sql.Identifier(table.key),
                default=sql.Identifier(table.default),
            )
        )
        return [day for (day,) in cursor.fetchall()]


def _attach_day(table: PartitionedTable, day: date) -> None:
    """Make `day`'s partition as a table of its own, move the rows of that day out of
    the default partition into it, and attach it (PostgreSQL checks the default holds
    none of that day any more)."""
    names = {
        "parent": sql.Identifier(table.table),
        "part": sql.Identifier(table.partition(day)),
        "default": sql.Identifier(table.default),
        "key": sql.Identifier(table.key),
    }
    bounds = [day_start(day), day_start(day + timedelta(days=1))]
    statements = [
        ("CREATE TABLE {part} (LIKE {parent} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)", []),
        ("LOCK TABLE {default} IN ACCESS EXCLUSIVE MODE", []),
        ("INSERT INTO {part} SELECT * FROM {default} WHERE {key} >= %s AND {key} < %s", bounds),
        ("DELETE FROM {default} WHERE {key} >= %s AND {key} < %s", bounds),
        ("ALTER TABLE {parent} ATTACH PARTITION {part} FOR VALUES FROM (%s) TO (%s)", bounds),
    ]
    _with_short_locks(statements, names)


def drop_day(table: PartitionedTable, day: date) -> None:
    """Detach and drop `day`'s partition of `table`: its rows are gone at once."""
    names = {"parent": sql.Identifier(table.table), "part": sql.Identifier(table.partition(day))}
    statements = [
        ("ALTER TABLE {parent} DETACH PARTITION {part}", []),
        ("DROP TABLE {part}", []),
    ]
    _with_short_locks(statements, names)


def _with_short_locks(statements: list[tuple[str, list]], names: dict) -> None:
    """Run `statements` in one transaction whose locks are each waited for at most
    LOCK_TIMEOUT_MS: writers queue behind a lock being waited for, so a long wait
    would stall every send. On a time-out, roll back and try again a little later."""
    for attempt in range(LOCK_ATTEMPTS):
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT_MS}ms'")
                for statement, parameters in statements:
                    cursor.execute(composed(statement, **names), parameters)
            return
        except OperationalError as error:
            if "lock timeout" not in str(error) or attempt == LOCK_ATTEMPTS - 1:
                raise
            time.sleep(0.1 * (attempt + 1))
