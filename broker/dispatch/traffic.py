"""The per-hop traffic log, written off the hop's path.

A dispatcher appends its batch's `TrafficRecord`s to one Redis stream in the same
pipeline that acknowledges the batch (so a hop and its record stand or fall together),
and every consumer moves them into PostgreSQL every FLUSH_INTERVAL_S. The move is
exactly once: it takes the entries after the watermark stored in PostgreSQL and moves
the watermark in the same transaction, under a lock that lets one process flush at a
time; entries are trimmed from Redis only after that commit.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

import orjson
from django.db import connection, transaction

from broker.dispatch.transport import broker_redis
from broker.models import TrafficRecord, TrafficWatermark

STREAM = "sn-tree:traffic"
FIELD = b"rows"
FLUSH_BATCH = 2_000  # stream entries per flush transaction (each holds a batch's rows)
FLUSH_LOCK = (7_102, 1)


def record(pipeline, rows: Iterable[tuple]) -> None:
    """Append traffic rows (event id, dispatcher id, direction, forwarded to, delivered,
    wasted, at) to the log, in `pipeline` (the caller executes it)."""
    rows = [(*row[:6], row[6].isoformat()) for row in rows]
    if rows:
        pipeline.xadd(STREAM, {FIELD: orjson.dumps(rows)})


# Records of events or dispatchers deleted meanwhile (a tree rebuilt) are dropped here.
INSERT_RECORDS = f"""
INSERT INTO {TrafficRecord._meta.db_table}
    (event_id, dispatcher_id, direction, forwarded_to, delivered, wasted, at)
SELECT t.event_id, t.dispatcher_id, t.direction, t.forwarded_to, t.delivered, t.wasted, t.at
FROM unnest(
    %s::uuid[], %s::bigint[], %s::text[], %s::jsonb[], %s::int[], %s::int[], %s::timestamptz[]
) AS t(event_id, dispatcher_id, direction, forwarded_to, delivered, wasted, at)
JOIN broker_event AS e ON e.id = t.event_id
JOIN broker_dispatcher AS d ON d.id = t.dispatcher_id
"""


def flush() -> int:
    """Move logged records into PostgreSQL; return how many stream entries were moved
    (0 when another process is flushing)."""
    if not unflushed():
        return 0  # asked often, and mostly idle: ask Redis, not PostgreSQL
    with transaction.atomic():
        if not _locked():
            return 0
        watermark = TrafficWatermark.objects.select_for_update().get_or_create(pk=1)[0]
        start = f"({watermark.last_entry}" if watermark.last_entry else "-"
        entries = broker_redis().xrange(STREAM, min=start, max="+", count=FLUSH_BATCH)
        if not entries:
            return 0
        _insert([row for _, fields in entries for row in orjson.loads(fields[FIELD])])
        watermark.last_entry = entries[-1][0].decode()
        watermark.save(update_fields=["last_entry"])
    _trim(watermark.last_entry)
    return len(entries)


def _locked() -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_xact_lock(%s, %s)", FLUSH_LOCK)
        return cursor.fetchone()[0]


def _insert(rows: list[list[Any]]) -> None:
    columns: list[list[Any]] = [[] for _ in range(7)]
    for row in rows:
        for index, value in enumerate(row):
            columns[index].append(value)
    columns[3] = [orjson.dumps(targets).decode() for targets in columns[3]]
    columns[6] = [datetime.fromisoformat(at) for at in columns[6]]
    with connection.cursor() as cursor:
        cursor.execute(INSERT_RECORDS, columns)


def _trim(last_entry: str) -> None:
    """Drop what is now in PostgreSQL: everything up to and including `last_entry`."""
    pipeline = broker_redis().pipeline(transaction=False)
    pipeline.xtrim(STREAM, minid=last_entry, approximate=False)
    pipeline.xdel(STREAM, last_entry)
    pipeline.execute()


def unflushed() -> int:
    """Records logged and not yet in PostgreSQL (in stream entries)."""
    return broker_redis().xlen(STREAM)
