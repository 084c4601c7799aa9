"""Writing what the service would have written: audit entries (changes and
refusals), events with their sequences and cursors, and hops, by COPY."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field

from django.db import connection

from broker.audit import MAX_LISTED_NAMES, authentication_code
from broker.models import AuditEntry, ChannelCursor, Event, TrafficRecord
from demo.bulk import copy_rows
from demo.synthetic.clock import to_datetime

AUDIT_FIELDS = ["at", "actor", "action", "target", "outcome", "reason", "details"]
ENTRY_FIELDS = [*AUDIT_FIELDS, "mac"]
DONE, REFUSED = AuditEntry.Outcome.DONE, AuditEntry.Outcome.REFUSED


def listed(names: list[str]) -> dict:
    """As broker.audit.listed: the first names, and how many more."""
    shown = names[:MAX_LISTED_NAMES]
    return {"names": shown, "unlisted": len(names) - len(shown)}


@dataclass
class AuditRows:
    """Audit entries to write, as the services would have written them."""

    rows: list[tuple] = field(default_factory=list)

    def change(self, at: int, actor: str, action: str, target: str, details=None) -> None:
        self.rows.append((at, actor, action, target, DONE, "", details or {}))

    def refusal(self, at: int, actor: str, action: str, target: str, reason: str, details) -> None:
        """A refusal; `details` carries its category."""
        self.rows.append((at, actor, action, target, REFUSED, reason, details))

    def write(self) -> int:
        """Write them in time order (ids grow with time, as in the service's log)."""
        self.rows.sort(key=lambda row: row[0])
        copy_rows(AuditEntry, ENTRY_FIELDS, (_audit_row(*row) for row in self.rows))
        return len(self.rows)


def _audit_row(at, actor, action, target, outcome, reason, details) -> tuple:
    """The entry's columns (AUDIT_FIELDS, then its authentication code)."""
    text = json.dumps(details)
    fields = {"at": to_datetime(at), "actor": actor, "action": action, "target": target,
              "outcome": outcome, "reason": reason}  # fmt: skip
    return (*fields.values(), text, authentication_code(**fields, details=json.loads(text)))


# The cursor, or the channel's highest sequence if higher (it never is, if every
# publish moved its cursor; a cursor lost would otherwise make sequences collide).
LOCK_CURSORS = f"""
SELECT cursor.sender_id, cursor.channel, greatest(cursor.last_sequence, (
    SELECT max(sequence) FROM {Event._meta.db_table} AS event
    WHERE event.sender_id = cursor.sender_id AND event.channel = cursor.channel
), 0)
FROM {ChannelCursor._meta.db_table} AS cursor
WHERE (cursor.sender_id, cursor.channel) IN (SELECT * FROM unnest(%s::bigint[], %s::text[]))
ORDER BY 1, 2 FOR UPDATE
"""
ENSURE_CURSORS = f"""
INSERT INTO {ChannelCursor._meta.db_table} (sender_id, channel, last_sequence)
SELECT * FROM unnest(%s::bigint[], %s::text[], %s::bigint[])
ON CONFLICT (sender_id, channel) DO NOTHING
"""
MOVE_CURSORS = f"""
UPDATE {ChannelCursor._meta.db_table} AS cursor SET last_sequence = moved.last
FROM unnest(%s::bigint[], %s::text[], %s::bigint[]) AS moved(sender_id, channel, last)
WHERE cursor.sender_id = moved.sender_id AND cursor.channel = moved.channel
"""


def number_events(events: list) -> None:
    """Give each event (in time order) the next sequence of its sender's channel,
    after the last one used, and move the cursors (locked until commit, as
    publishing locks them)."""
    streams = sorted({(e.sender.id, e.send.channel) for e in events})
    senders, channels = [s for s, _ in streams], [c for _, c in streams]
    with connection.cursor() as cursor:
        cursor.execute(ENSURE_CURSORS, [senders, channels, [0] * len(streams)])
        cursor.execute(LOCK_CURSORS, [senders, channels])
        last = {(s, c): n for s, c, n in cursor.fetchall()}
        for event in events:
            stream = (event.sender.id, event.send.channel)
            last[stream] += 1
            event.sequence = last[stream]
        cursor.execute(MOVE_CURSORS, [senders, channels, [last[s] for s in streams]])


EVENT_FIELDS = [
    "id", "sender", "channel", "sequence", "content", "selector", "sender_attributes",
    "lifetime_s", "published_at", "expires_at", "routed_at", "idempotency_key", "sent_by",
    "resend_of", "recipients",
]  # fmt: skip


def write_events(events: Iterable) -> None:
    copy_rows(Event, EVENT_FIELDS, (_event_row(event) for event in events))


def _event_row(event) -> tuple:
    send = event.send
    recipients = sorted(event.audience.recipients) if event.audience.recipients else None
    return (
        event.id, event.sender.id, send.channel, event.sequence, json.dumps(send.content),
        send.selector, json.dumps(event.sender_attributes), send.lifetime_s,
        to_datetime(event.at), to_datetime(event.expires_at), to_datetime(event.routed_at),
        "", send.sent_by, event.resend_of.id if event.resend_of else None, recipients,
    )  # fmt: skip


HOP_FIELDS = ["event", "dispatcher", "direction", "forwarded_to", "delivered", "wasted", "at"]


def write_hops(events: Iterable) -> int:
    rows = [
        (event.id, hop.dispatcher, hop.direction, json.dumps(hop.forwarded_to), hop.delivered,
         hop.wasted, to_datetime(hop.at))
        for event in events for hop in event.route.hops
    ]  # fmt: skip
    rows.sort(key=lambda row: row[-1])
    copy_rows(TrafficRecord, HOP_FIELDS, rows)
    return len(rows)
