"""What the database's transaction counter must be past, and whether it is.

Rows carry the transaction that last wrote them (`txid`), and the readers that follow
them (the leaves' client changes, the reports' export, the audit chain) keep watermarks
of the same counter: each asks for what transactions between its watermark and
PostgreSQL's snapshot xmin wrote. A base backup keeps the counter; a logical dump
(`pg_dump`) restored into another server does not: that server counts from its own
start, below every stored `txid`, and what is written there afterwards would look older
than what the readers have already taken, and never be read. `manage.py after_restore`
says so and what to run (docs/operations.md, "Restoring").
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date

from django.db import connection
from psycopg import sql

from lifecycle.partitions import PARTITIONED, PartitionedTable, composed, days_of
from lifecycle.retention import Waiting, past_retention, retain_days, waiting_for

# Columns that hold a watermark of the counter (a snapshot's xmin): the counter must
# reach them, not pass them.
WATERMARKS = (
    ("auditchain_chainhead", "horizon"),
    ("auditchain_chainhead", "verified_horizon"),
    ("reports_exportwatermark", "txid"),  # a few rows, without an index on it
)
EPOCH_BITS = 32
HIGHEST = "SELECT max({column}) FROM {table}"
# The first value not handed out yet, as this transaction sees it: past its own, if it
# has written (a snapshot's xmax does not count the transaction that takes it).
NEXT_VALUE = """
SELECT greatest(
    pg_snapshot_xmax(pg_current_snapshot())::text::bigint,
    coalesce(pg_current_xact_id_if_assigned()::text::bigint + 1, 0)
)"""


@dataclass(frozen=True)
class TransactionCounter:
    """The counter's next value (`xmax` of a snapshot taken now) against the least
    value the stored rows and watermarks need it to have reached, and where that is."""

    next_value: int
    needed: int
    needed_by: str

    @property
    def behind(self) -> bool:
        """Whether the counter is below what is stored: a logical restore."""
        return self.needed > self.next_value

    @property
    def epoch_needed(self) -> int:
        """The counter's epoch (its upper 32 bits, the one part `pg_resetwal -e` may
        set freely) that puts every value it hands out past what is stored."""
        return (self.needed >> EPOCH_BITS) + 1


def transaction_counter(*, thorough: bool = True) -> TransactionCounter:
    """Read the counter and the highest stored `txid` and watermark, table by table:
    each is the top of an index. Not `thorough` (the health check, every few seconds):
    the tables that are not partitioned only (events and the audit log are written by
    every send), sparing the planning of a read of every day's partition."""
    with connection.cursor() as cursor:
        cursor.execute(NEXT_VALUE)
        next_value = cursor.fetchone()[0]
        needed, needed_by = 0, "nothing"
        for table, column, past in _counter_columns(cursor, thorough=thorough):
            cursor.execute(
                composed(HIGHEST, column=sql.Identifier(column), table=sql.Identifier(table))
            )
            highest = cursor.fetchone()[0]
            if highest is not None and highest + past > needed:
                needed, needed_by = highest + past, f"{table}.{column}"
    return TransactionCounter(next_value, needed, needed_by)


def _counter_columns(cursor, *, thorough: bool) -> list[tuple[str, str, int]]:
    """(table, column, 1 when the counter must pass the value, 0 when reaching it is
    enough) for every `txid` column of the schema's tables and every watermark."""
    # Those an index leads with (every `txid` a reader follows has one): the top of
    # the index is the column's highest value, where a table without one would be read
    # whole at every health check.
    cursor.execute(
        "SELECT c.relname FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid"
        " WHERE a.attname = 'txid' AND NOT a.attisdropped AND c.relkind::text = ANY(%s)"
        " AND NOT c.relispartition AND c.relnamespace = current_schema()::regnamespace"
        " AND EXISTS (SELECT FROM pg_index i WHERE i.indrelid = c.oid AND i.indkey[0] = a.attnum)"
        " ORDER BY c.relname",
        [["r", "p"] if thorough else ["r"]],
    )
    columns = [(table, "txid", 1) for (table,) in cursor.fetchall()]
    present = set(connection.introspection.table_names(cursor))
    return columns + [(table, column, 0) for table, column in WATERMARKS if table in present]


@dataclass(frozen=True)
class TableRetention:
    """One partitioned table as the health page shows it: how many days it keeps
    and holds, rows waiting in its default partition (the beat has not made their
    day yet), how many days are past retention, and the oldest of them with why they
    are kept ("" when the next run drops it)."""

    table: str
    retain_days: int
    days: list[date]
    in_default: int
    past: int
    waiting: list[Waiting]

    @property
    def ok(self) -> bool:
        return not self.in_default and not any(w.why for w in self.waiting)


WAITING_SHOWN = 3  # days past retention each table shows the reasons of, oldest first


def retention_state() -> list[TableRetention]:
    """Every partitioned table's retention, now (the catalog, the default partitions'
    rows and the watermark, for the oldest few days past retention: no scan of a
    day's rows)."""
    state = []
    for table in PARTITIONED:
        past = past_retention(table)
        waiting = [
            Waiting(table.table, day, waiting_for(table, day, live=False))
            for day in past[:WAITING_SHOWN]
        ]
        state.append(
            TableRetention(
                table=table.table,
                retain_days=retain_days(table),
                days=days_of(table),
                in_default=_rows_in_default(table),
                past=len(past),
                waiting=waiting,
            )
        )
    return state


def _rows_in_default(table: PartitionedTable) -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            composed("SELECT count(*) FROM {default}", default=sql.Identifier(table.default))
        )
        return cursor.fetchone()[0]
