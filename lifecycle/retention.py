"""Retention that loses nothing (docs/operations.md, "Retention").

A day's partition of a table older than its group's RETAIN_DAYS is dropped whole, and
only once the reports' export has covered every row in it: the export runs first, and
a partition holding a row written after the export's watermark waits (the health page
says so). Before a day of deliveries goes, each of its events keeps what they came to
(`ArchivedEvent`), which its page shows. A partition holding anything of a live event
waits too; with events living at most a week and RETAIN_DAYS at least eight, none does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone
from psycopg import sql

from auditchain.models import ChainHead
from auditchain.services import trim_through
from broker import audit
from broker.audit import Actor
from broker.models import ArchivedEvent, ClientChange
from broker.reads.progress import NO_DISPATCHER, NO_REGION, state_counts
from lifecycle.models import DroppedDay
from lifecycle.partitions import (
    ATTRIBUTE_HISTORY,
    CLIENT_CHANGES,
    DELIVERIES,
    PARTITIONED,
    PartitionedTable,
    composed,
    day_start,
    days_of,
    drop_day,
    ensure_day,
    ensure_partitions,
    partitions_held,
    today,
)
from reports.export import export_changes
from reports.models import ExportWatermark

RETENTION = Actor("system", "retention")


@dataclass(frozen=True)
class Waiting:
    """A day past retention that is kept, and why."""

    table: str
    day: date
    why: str


@dataclass
class Retention:
    """What one run of retention dropped, and what it had to keep."""

    dropped: list[DroppedDay] = field(default_factory=list)
    waiting: list[Waiting] = field(default_factory=list)
    audit_entries_removed: int = 0
    values_carried: int = 0  # attribute values carried into the first day kept


def retain_days(table: PartitionedTable) -> int:
    """How many days of `table` are kept (RETAIN_DAYS, or its group's own; the change
    log's own few, ClientChange.KEPT_DAYS)."""
    if table is CLIENT_CHANGES:
        return ClientChange.KEPT_DAYS
    return settings.RETAIN_DAYS_BY_GROUP[table.group]


def horizon(table: PartitionedTable) -> date:
    """The first day of `table` that is kept: the ones before it are past retention."""
    return today() - timedelta(days=retain_days(table))


def past_retention(table: PartitionedTable) -> list[date]:
    """The days `table` still holds that retention would drop."""
    first_kept = horizon(table)
    return [day for day in days_of(table) if day < first_kept]


def apply_retention(*, export: bool = True) -> Retention:
    """Bring the dataset up to date (unless `export` is False), then drop every day
    past retention that it covers and that holds nothing of a live event."""
    ensure_partitions()
    due = {table: past_retention(table) for table in PARTITIONED}
    if export and (any(d for t, d in due.items() if t.exported_as) or settings.AUDIT_RETAIN_DAYS):
        export_changes()
    outcome = Retention(audit_entries_removed=trim_audit_log())
    with partitions_held():
        for table in PARTITIONED:
            droppable = droppable_days(table, outcome)
            if table is ATTRIBUTE_HISTORY and droppable:
                outcome.values_carried = carry_forward()
            outcome.dropped += [drop_past_day(table, day) for day in droppable]
    return outcome


def droppable_days(table: PartitionedTable, outcome: Retention) -> list[date]:
    """The days of `table` past retention that may go; those that wait go to `outcome`."""
    droppable = []
    for day in past_retention(table):  # again: another run may have dropped some
        why = waiting_for(table, day)
        if why:
            outcome.waiting.append(Waiting(table.table, day, why))
        else:
            droppable.append(day)
    return droppable


def waiting_for(table: PartitionedTable, day: date, *, live: bool = True) -> str:
    """Why `day` of `table` may not be dropped yet ("" when it may); `live`: look
    for rows of live events too (a scan of the day)."""
    if table.exported_as:
        watermark = export_watermark(table)
        if watermark is None:
            return "the reports have never exported it"
        highest = _scalar("SELECT max(txid) FROM {part}", table, day)
        if highest is not None and highest >= watermark:
            return "rows written since the reports' last export"
    if live and table.of_events and _scalar(LIVE_EVENT, table, day):
        return "it holds rows of an event still live"
    return ""


LIVE_EVENT = (
    "SELECT EXISTS (SELECT FROM {part} AS x JOIN broker_event AS e ON e.id = x.event_id"
    " WHERE e.expires_at > now())"
)


def export_watermark(table: PartitionedTable) -> int | None:
    """The transaction below which the reports have exported `table`'s rows (None:
    never, or it is not exported)."""
    found = ExportWatermark.objects.filter(table=table.exported_as)
    return found.values_list("txid", flat=True).first()


def _scalar(template: str, table: PartitionedTable, day: date):
    with connection.cursor() as cursor:
        cursor.execute(composed(template, part=sql.Identifier(table.partition(day))))
        return cursor.fetchone()[0]


def drop_past_day(table: PartitionedTable, day: date) -> DroppedDay:
    """Archive the day's events (deliveries), drop the partition and record it, in
    one transaction: the parent's lock, taken last, is held only for the record. Drops
    whatever the day holds: `waiting_for` says whether it may."""
    with transaction.atomic():
        rows = _scalar("SELECT count(*) FROM {part}", table, day)
        archived = archive_events(day) if table is DELIVERIES else 0
        watermark = export_watermark(table)
        drop_day(table, day)
        dropped = DroppedDay.objects.create(
            table=table.table, day=day, rows=rows, watermark=watermark, dropped_at=timezone.now()
        )
        details = {"rows": rows, "watermark": watermark, "events_archived": archived}
        audit.record_change(
            actor=RETENTION, action="retention.drop", target=f"{table.table}:{day}", details=details
        )
    return dropped


def archive_events(day: date) -> int:
    """Keep what the deliveries of `day`'s partition came to, for each event in it;
    returns how many events. Idempotent (a second run writes the same)."""
    counts: dict[str, list] = {}
    part = composed("{part}", part=sql.Identifier(DELIVERIES.partition(day)))
    with connection.cursor() as cursor:
        # Counted as the event's page counts them (broker.reads.progress).
        cursor.execute(state_counts(part, per_event=True), [NO_REGION, NO_DISPATCHER])
        for event_id, *row in cursor.fetchall():
            counts.setdefault(event_id, []).append(row)
    now = timezone.now()
    ArchivedEvent.objects.bulk_create(
        [ArchivedEvent(event_id=e, archived_at=now, counts=rows) for e, rows in counts.items()],
        update_conflicts=True,
        unique_fields=["event"],
        update_fields=["archived_at", "counts"],
    )
    return len(counts)


# For each client (still registered) and attribute, its newest row before the first
# moment kept, unless one takes effect at that very moment: a copy of it, taking effect
# then. A second run the same day finds the copies and adds none.
CARRY_FORWARD = """
INSERT INTO {parent} (client_id, name, kind, value, source, authority_id, set_at,
                      expires_at, revoked_by, at, carried_from)
SELECT h.client_id, h.name, h.kind, h.value, h.source, h.authority_id, h.set_at,
       h.expires_at, h.revoked_by, %(first_kept)s, coalesce(h.carried_from, h.at)
FROM (SELECT DISTINCT ON (client_id, name) * FROM {parent} WHERE at < %(first_kept)s
      ORDER BY client_id, name, at DESC, id DESC) AS h
WHERE EXISTS (SELECT FROM broker_client AS c WHERE c.id = h.client_id)
  AND NOT EXISTS (
    SELECT FROM {parent} AS kept
    WHERE kept.client_id = h.client_id AND kept.name = h.name AND kept.at = %(first_kept)s)
"""


def carry_forward() -> int:
    """Copy the attribute values standing at the first moment kept into it, before
    the days past retention are dropped, so that what a client held "as of" any
    moment kept reads the same after the drop; returns how many (audited). One
    statement in a transaction of its own: it takes no lock a send waits for.
    Idempotent. Hold `partitions_held`."""
    first_kept = day_start(horizon(ATTRIBUTE_HISTORY))
    ensure_day(ATTRIBUTE_HISTORY, first_kept.date())
    with transaction.atomic(), connection.cursor() as cursor:
        parent = sql.Identifier(ATTRIBUTE_HISTORY.table)
        cursor.execute(composed(CARRY_FORWARD, parent=parent), {"first_kept": first_kept})
        carried = cursor.rowcount
        if carried:
            audit.record_change(
                actor=RETENTION, action="retention.carry_forward",
                target=f"{ATTRIBUTE_HISTORY.table}:{first_kept.date()}",
                details={"values": carried},
            )  # fmt: skip
    return carried


# The first link of the chain to keep: that of the oldest entry written since the
# horizon, or not yet exported (links follow the order transactions ended in).
FIRST_KEPT_LINK = """
SELECT min(l.position) FROM auditchain_auditlink l
JOIN broker_auditentry e ON e.id = l.entry_id
WHERE e.at >= %s OR e.txid >= %s
"""


def trim_audit_log() -> int:
    """Remove the audit entries older than AUDIT_RETAIN_DAYS (0: none ever) that the
    export has covered, from the oldest link on; audited. Returns how many."""
    if not settings.AUDIT_RETAIN_DAYS:
        return 0
    watermark = ExportWatermark.objects.filter(table="audit").values_list("txid", flat=True)
    if not watermark:
        return 0
    horizon = timezone.now() - timedelta(days=settings.AUDIT_RETAIN_DAYS)
    with connection.cursor() as cursor:
        cursor.execute(FIRST_KEPT_LINK, [horizon, watermark[0]])
        first_kept = cursor.fetchone()[0]
    head = ChainHead.objects.values_list("position", flat=True).first()
    if head is None:
        return 0
    through = head if first_kept is None else first_kept - 1
    removed = trim_through(position=through)
    if removed:
        audit.record_change(
            actor=RETENTION, action="retention.audit", target="audit-log",
            details={"entries": removed, "through_link": through, "before": horizon.isoformat()},
        )  # fmt: skip
    return removed
