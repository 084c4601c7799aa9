"""Exact matching at a leaf and writing deliveries, in order, exactly once.

For every stream (sender, channel) a receiver gets events in sequence order without
gaps: before an event is delivered, the stream's earlier live events the receiver has
not yet been given are decided for it too, so that nothing later overtakes them. Once
a receiver holds sequence n of a stream, earlier events of that stream are final.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from itertools import groupby
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from broker import audit
from broker.audit import Actor
from broker.dispatch.routed import (
    LiveSelectors,
    RoutedEvent,
    live_events,
    live_events_after,
    live_selectors,
)
from broker.dispatch.state import LEAF_LOCK_NAMESPACE, Before, LeafState
from broker.models import Delivery
from broker.prepared import int_array, prepared_cursor, text_array
from broker.push import to_agents, to_consoles
from broker.push.to_agents import Pushed
from broker.reads.clients import client_names


def lock_leaf(dispatcher_id: int) -> None:
    """Serialise delivery at one leaf (inside the caller's transaction); the tree's own
    hops take the lock with the leaf's state (`state.locked_leaf_state`)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [LEAF_LOCK_NAMESPACE, dispatcher_id])


def deliver_routed(state: LeafState, events: list[RoutedEvent]) -> dict[str, int]:
    """Deliver `events` to the leaf's matching receivers; return deliveries per event.

    One statement in the usual case: each receiver's position in the stream is read
    by the insert itself, which writes the rows that continue it. Where a receiver
    is further behind than the batch reaches (a hole: events of the stream it has not
    been given and the batch does not hold), the insert leaves that receiver's rows
    out and returns its position, and its stream is planned with the events between.
    """
    matched = {e.id: _receivers_of(state, e) for e in events}
    if settings.TREE_MATCHING:
        _audit_policy_refusals(state, events, matched)
    streams = [
        (stream, list(group))
        for stream, group in groupby(sorted(events, key=_order), key=lambda e: e.stream)
    ]
    pushed, behind = _insert(
        [row for stream, batch in streams for row in _straight_rows(batch, matched)]
    )
    if behind:
        pushed += _insert([(d, 0) for d in _planned(state, streams, matched, behind)])[0]
    counts: dict[str, int] = defaultdict(int)
    for delivery in pushed:
        counts[delivery.event_id] += 1
    return counts


def _straight_rows(batch: list[RoutedEvent], matched) -> list[tuple[NewDelivery, int]]:
    """Each receiver's matched events of one stream's batch, in sequence order, with
    the lowest last sequence they may follow without a hole in the receiver's stream:
    the one before the run of consecutive sequences the batch ends with."""
    sequences = {e.sequence for e in batch}
    run_start = batch[-1].sequence
    while run_start - 1 in sequences:
        run_start -= 1
    rows = []
    for receiver_id in sorted(set().union(*(matched[e.id] for e in batch))):
        rows.extend(
            (_delivery(e, receiver_id), run_start - 1)
            for e in batch
            if receiver_id in matched[e.id]
        )
    return rows


def _planned(state, streams, matched, behind) -> list[NewDelivery]:
    """The deliveries of the receivers `behind` ({(receiver, sender, channel):
    position}) in the streams they are behind in, the events between included."""
    pending = []
    for stream, batch in streams:
        receivers = sorted(r for (r, *pair) in behind if tuple(pair) == stream)
        plans = _plan_stream(state, stream, batch, matched, behind, receivers)
        pending.extend(_delivery(e, r) for r, planned in plans.items() for e in planned)
    return pending


def deliver_late(state: LeafState, changes: Mapping[int, Before]) -> int:
    """Give changed receivers the live events they now match (persistence); `changes`
    holds each one as it was before (None: unknown).

    Only the events that may be due are read: those whose selector selects one of the
    receivers whose verdicts may have turned, past the lowest of their positions in the
    event's stream. Reading and matching every live event at each change held the
    leaf's lock for 50 to 300 ms in the 50-ponger ping-pong (2,000 to 3,000 live
    events), and clients that state a figure such as their load change many times a
    second."""
    live = live_selectors()
    receivers = _verdicts_may_have_turned(state, changes, live)
    if not receivers:
        return 0
    addressed = _addressed(state, receivers, live)
    streams = sorted({stream for text in addressed for stream in live.streams[text]})
    positions = _positions(receivers, streams)
    lowest = {s: min(positions.get((r, *s), 0) for r in receivers) for s in streams}
    pending: list[NewDelivery] = []
    for _, batch in groupby(live_events_after(lowest, addressed), key=lambda e: e.stream):
        pending.extend(_late_in_stream(state, list(batch), addressed, positions))
    return len(insert_deliveries(pending))


def _verdicts_may_have_turned(state: LeafState, changes, live: LiveSelectors) -> list[int]:
    """The changed receivers for which some live event's verdict may differ from before:
    those new here or of unknown past, those whose policy changed, and those for which
    a live selector decides otherwise. The others match the live events they matched,
    which they hold already or which hops on their way bring (the tree routed those for
    them as they were): giving them those early only wrote rows the hops then skipped,
    up to 600 at a time in the 50-ponger ping-pong, whose pongers state their load."""
    selectors = [s for s in map(live.typed, live.streams) if s is not None]
    turned = []
    for receiver in sorted(r for r in changes if r in state.matcher):
        before = changes[receiver]
        if before is None or before[1] != state.matcher.policy(receiver):
            turned.append(receiver)
            continue
        now = state.matcher.attributes(receiver)
        if any(s.selects(before[0]) != s.selects(now) for s in selectors):
            turned.append(receiver)
    return turned


def _addressed(state: LeafState, receivers: list[int], live: LiveSelectors) -> dict[str, set[int]]:
    """{selector text: those of `receivers` it selects}, for the texts selecting any."""
    addressed = {}
    for text in live.streams:
        selector = live.typed(text)
        chosen = {
            r
            for r in receivers
            if selector is None or selector.selects(state.matcher.attributes(r))
        }
        if chosen:
            addressed[text] = chosen
    return addressed


def _late_in_stream(state: LeafState, batch, addressed, positions) -> list[NewDelivery]:
    """The receivers' deliveries of one stream's candidate events: each receiver's
    events past its position that it matches, in sequence order."""
    stream = batch[0].stream
    receivers = sorted(set().union(*(addressed[e.selector_text] for e in batch)))
    return [
        _delivery(e, r)
        for r in receivers
        for e in batch
        if r in addressed[e.selector_text]
        and e.sequence > positions.get((r, *stream), 0)
        and _matches(state, r, e)
    ]


def _receivers_of(state: LeafState, event: RoutedEvent) -> set[int]:
    """Exact matching; with matching switched off (a benchmark baseline), everyone."""
    if not settings.TREE_MATCHING:
        return state.matcher.selected(None)
    matched = state.matcher.match(event.sender_attributes, event.content, event.selector)
    return event.reachable(matched)


def _audit_policy_refusals(state: LeafState, batch, matched) -> None:
    """Receivers the sender addressed whose policy refused it: visible in the audit log,
    one entry per event and kind of refusal (the sender not qualified, or its content
    filtered), the sender and the receivers by name (one query for all the batch's
    names)."""
    refused = {}
    for event in batch:
        # A resend addresses only its recipients.
        ids = event.reachable(state.matcher.selected(event.selector)) - matched[event.id]
        if ids:
            refused[event.id] = _by_category(state, event, sorted(ids))
    if not refused:
        return
    # Beyond the names an entry lists, refusers are only counted: no need to read them.
    wanted = {e.sender_id for e in batch if e.id in refused}
    for groups in refused.values():
        wanted.update(*(ids[: audit.MAX_LISTED_NAMES] for ids in groups.values()))
    names = client_names(wanted)
    for event in batch:
        for category, refusers in refused.get(event.id, {}).items():
            _audit_refusal(state, event, category, refusers, names)


def _by_category(state: LeafState, event: RoutedEvent, refusers: list[int]) -> dict:
    """{category: refusers} (ids in order). Receivers sharing a policy share its
    verdict: each distinct policy is classified once per event."""
    verdicts: dict = {}
    groups: dict[str, list[int]] = {}
    for receiver_id in refusers:
        policy = state.matcher.policy(receiver_id)
        if policy not in verdicts:
            verdicts[policy] = audit.policy_refusal_category(
                policy.filters(), event.sender_attributes
            )
        groups.setdefault(verdicts[policy], []).append(receiver_id)
    return groups


REFUSAL_REASONS = {
    audit.SENDER_NOT_QUALIFIED: "refuse this sender under their policies, whatever it sends",
    audit.CONTENT_FILTERED: "accept this sender but refuse this content under their policies",
}


def _audit_refusal(state: LeafState, event: RoutedEvent, category, refusers, names) -> None:
    listed = [names[i] for i in refusers[: audit.MAX_LISTED_NAMES] if i in names]
    audit.record_refusal(
        actor=Actor("client", names.get(event.sender_id, str(event.sender_id))),
        action="event.refused_by_policy",
        target=f"event:{event.id}",
        reason=f"{len(refusers)} receiver{'s' if len(refusers) != 1 else ''} addressed here "
        + REFUSAL_REASONS[category],
        details={
            "leaf": state.dispatcher_id,
            "category": category,
            "refusers": len(refusers),
            "receivers": audit.listed(sorted(listed), total=len(refusers)),
        },
    )


def _order(event: RoutedEvent) -> tuple:
    return (event.sender_id, event.channel, event.sequence)


def _plan_stream(
    state, stream, batch, matched, positions, receivers
) -> dict[int, list[RoutedEvent]]:
    plans = {}
    gaps: list[RoutedEvent] | None = None
    sequences = {e.sequence for e in batch}
    for receiver_id in receivers:
        position = positions.get((receiver_id, *stream), 0)
        due = [e for e in batch if receiver_id in matched[e.id] and e.sequence > position]
        if not due:
            continue
        # Events of the stream between the receiver's position and the batch's last one
        # that are not in the batch (held up upstream, say by a lost wake-up) must be
        # decided now: once the receiver holds a later one, they are final.
        if _has_hole(sequences, position, due[-1].sequence):
            gaps = gaps if gaps is not None else _stream_events(stream, batch)
            earlier = [e for e in gaps if position < e.sequence < due[-1].sequence]
            due = sorted(
                due + [e for e in earlier if _matches(state, receiver_id, e)],
                key=lambda e: e.sequence,
            )
        plans[receiver_id] = due
    return plans


def _has_hole(sequences: set[int], position: int, last: int) -> bool:
    """Whether some sequence after `position` and before `last` is not in `sequences`."""
    present = sum(1 for sequence in sequences if position < sequence < last)
    return present < last - position - 1


def _stream_events(stream: tuple[int, str], batch: list[RoutedEvent]) -> list[RoutedEvent]:
    """Live events of the stream that are not in this batch."""
    in_batch = {e.id for e in batch}
    sender_id, channel = stream
    found = live_events(sender_id=sender_id, channel=channel, sequence__lt=batch[-1].sequence)
    return [e for e in found if e.id not in in_batch]


# A receiver's last sequence in a stream (`pairs`: receiver_id, sender_id, channel,
# and the stream's `ceiling`, its cursor's last sequence): one backward step of the
# index on (receiver, sender, channel, sequence), whatever the stream's length (a GROUP
# BY would read every delivery of the stream). A delivery above the ceiling holds a
# sequence no event of the stream was ever given (written into the database by hand):
# it must not stand for the receiver's place and hold back every genuine event after
# it, so then, and only then, a second step finds the last sequence at or below the
# ceiling, and the stream is said to be `unbacked` (docs/security.md).
# Only deliveries of events that expired at most Delivery.FINAL_AFTER_DAYS ago are read,
# the partitions from then on: every event published since the oldest live one was,
# expires in that range, so a receiver holds no live event above what is found there;
# what it held before is below every live event's sequence, and a receiver found
# behind by it is planned from the live events (`_planned`).
HELD = f"""
    SELECT coalesce(CASE WHEN top.sequence > pairs.ceiling THEN backed.sequence
                         ELSE top.sequence END, 0) AS sequence,
        coalesce(top.sequence > pairs.ceiling, false) AS unbacked,
        top.sequence AS top
    FROM (SELECT) AS one
    LEFT JOIN LATERAL (
        SELECT d.sequence FROM broker_delivery AS d
        WHERE d.receiver_id = pairs.receiver_id AND d.sender_id = pairs.sender_id
            AND d.channel = pairs.channel AND d.expires_at > {Delivery.FINAL_AFTER_SQL}
        ORDER BY d.sequence DESC
        LIMIT 1
    ) AS top ON true
    LEFT JOIN LATERAL (
        SELECT d.sequence FROM broker_delivery AS d
        WHERE top.sequence > pairs.ceiling
            AND d.receiver_id = pairs.receiver_id AND d.sender_id = pairs.sender_id
            AND d.channel = pairs.channel AND d.sequence <= pairs.ceiling
            AND d.expires_at > {Delivery.FINAL_AFTER_SQL}
        ORDER BY d.sequence DESC
        LIMIT 1
    ) AS backed ON true
"""
# The ceilings of the streams named (`s`: sender_id, channel).
CEILING = """
    SELECT coalesce(max(c.last_sequence), 0) AS ceiling FROM broker_channelcursor AS c
    WHERE c.sender_id = s.sender_id AND c.channel = s.channel
"""

POSITIONS = f"""
SELECT pairs.receiver_id, pairs.sender_id, pairs.channel, held.sequence, held.unbacked, held.top
FROM unnest(%s::bigint[]) AS r(receiver_id)
CROSS JOIN (
    SELECT s.sender_id, s.channel, cursor.ceiling
    FROM unnest(%s::bigint[], %s::text[]) AS s(sender_id, channel)
    CROSS JOIN LATERAL ({CEILING}) AS cursor
) AS s
CROSS JOIN LATERAL (SELECT r.receiver_id, s.sender_id, s.channel, s.ceiling) AS pairs
CROSS JOIN LATERAL ({HELD}) AS held
"""


# Streams (receiver, sender, channel) whose forged sequences this process reported.
_reported_unbacked: set[tuple[int, int, str]] = set()


def report_unbacked(streams: list[tuple[int, int, str, int]]) -> None:
    """Audit, once per process, each receiver's stream that holds a sequence no event of
    the stream was given (written into the database by hand): passed over for the
    receiver's place, it is told where the auditor looks."""
    new = [s for s in streams if s[:3] not in _reported_unbacked]
    if not new:
        return
    names = client_names({r for r, *_ in new} | {s for _, s, *_ in new})
    for receiver, sender, channel, top in new:
        _reported_unbacked.add((receiver, sender, channel))
        stream = f"{names.get(sender, sender)}/{channel}"
        audit.record_refusal(
            actor=audit.SYSTEM,
            action="delivery.unbacked_sequence",
            target=f"client:{names.get(receiver, receiver)}",
            reason=f"a delivery in {stream} holds sequence {top}, which no event of that "
            "stream was given (written into the database by hand?): it is passed over, "
            "and the receiver's genuine events are delivered after the last it holds",
            details={"stream": stream, "sequence": top},
        )


def _positions(receivers, streams: list[tuple[int, str]]) -> dict[tuple[int, int, str], int]:
    """{(receiver, sender, channel): highest sequence held} for these receivers and
    streams (0: none), in one query; a forged sequence above a stream's is reported and
    passed over."""
    if not receivers or not streams:
        return {}
    with prepared_cursor() as cursor:
        cursor.execute(
            POSITIONS,
            [
                list(receivers),
                [sender for sender, _ in streams],
                [channel for _, channel in streams],
            ],
        )
        rows = cursor.fetchall()
    report_unbacked([(r, s, c, top) for r, s, c, _, unbacked, top in rows if unbacked])
    return {(receiver, sender, channel): held for receiver, sender, channel, held, *_ in rows}


def _matches(state: LeafState, receiver_id: int, event: RoutedEvent) -> bool:
    if not event.may_reach(receiver_id):
        return False
    attributes = state.matcher.attributes(receiver_id)
    if event.selector is not None and not event.selector.selects(attributes):
        return False
    return state.matcher.policy(receiver_id).accepts(event.sender_attributes, event.content)


@dataclass(frozen=True, slots=True)
class NewDelivery:
    """A delivery row about to be inserted. Not a model instance: a leaf makes one per
    receiver and event, and building Django models was a sixth of a leaf's time in the
    50-ponger ping-pong."""

    event_id: str
    receiver_id: int
    sender_id: int
    channel: str
    sequence: int
    expires_at: datetime  # the event's: the row's partition
    delivered_at: datetime
    content: dict[str, Any]  # pushed with the notification, not stored twice


def _delivery(event: RoutedEvent, receiver_id: int) -> NewDelivery:
    return NewDelivery(
        str(event.id),
        receiver_id,
        event.sender_id,
        event.channel,
        event.sequence,
        event.expires_at,
        timezone.now(),
        event.content,
    )


# Under the leaf's lock no one else records deliveries for these receivers, so the
# rows found missing here are exactly the ones inserted, and each receiver's positions
# continue its stream without a gap: the stream's counter moves by what is inserted.
# Each receiver's last sequence in each stream is read here (LAST_SEQUENCE). A row is
# missing if its sequence is past that last one: a stream reaches a receiver in
# sequence order, so an event delivered already is at or below it (no lookup by
# event, which on a table without statistics the planner made a scan of the
# receiver's deliveries). A row comes
# with the lowest last sequence it may follow (`after`; 0: any): a receiver further
# behind in that stream gets none of its rows there, and its position is returned
# instead (`insert_deliveries`' callers plan such streams themselves, with 0).
# Streams are locked in client order, as confirmations lock them (no deadlock). The
# rows find their receiver's new last position in one map (`ends`, built once), not by
# a join: PostgreSQL cannot estimate these CTEs and compared every row with every
# receiver (60 ms for 500 receivers, four times that for 1,000).
INSERT_DELIVERIES = f"""
WITH input AS (
    SELECT * FROM unnest(
        %s::uuid[], %s::bigint[], %s::bigint[], %s::text[], %s::bigint[],
        %s::timestamptz[], %s::timestamptz[], %s::bigint[]
    ) WITH ORDINALITY
        AS t(event_id, receiver_id, sender_id, channel, sequence, expires_at, at, after, ord)
), streams AS MATERIALIZED (
    SELECT s.sender_id, s.channel, cursor.ceiling
    FROM (SELECT DISTINCT sender_id, channel FROM input) AS s
    CROSS JOIN LATERAL ({CEILING}) AS cursor
), held AS (
    SELECT pairs.receiver_id, pairs.sender_id, pairs.channel, pairs.after, held.*
    FROM (
        SELECT DISTINCT receiver_id, sender_id, channel, after, streams.ceiling
        FROM input JOIN streams USING (sender_id, channel)
    ) AS pairs
    CROSS JOIN LATERAL ({HELD}) AS held
), fresh AS (
    SELECT input.*,
        count(*) OVER (PARTITION BY input.receiver_id) AS n,
        row_number() OVER (PARTITION BY input.receiver_id ORDER BY input.ord) AS nth
    FROM input
    JOIN held USING (receiver_id, sender_id, channel, after)
    WHERE held.sequence >= input.after AND input.sequence > held.sequence
        -- Past a forged sequence, an event may be held already under it: not twice.
        AND NOT (held.unbacked AND EXISTS (
            SELECT FROM broker_delivery AS d
            WHERE d.event_id = input.event_id AND d.receiver_id = input.receiver_id
                AND d.expires_at = input.expires_at
        ))
), moved AS (
    INSERT INTO broker_receiverstream (client_id, last_position, confirmed_position)
    SELECT receiver_id, count(*), 0 FROM fresh GROUP BY receiver_id ORDER BY receiver_id
    ON CONFLICT (client_id)
    DO UPDATE SET last_position = broker_receiverstream.last_position + EXCLUDED.last_position
    RETURNING client_id, last_position
), ends AS MATERIALIZED (
    SELECT jsonb_object_agg(client_id, last_position) AS last_position FROM moved
), inserted AS (
    INSERT INTO broker_delivery (
        event_id, receiver_id, sender_id, channel, sequence, position, state, expires_at,
        delivered_at
    )
    SELECT fresh.event_id, fresh.receiver_id, fresh.sender_id, fresh.channel, fresh.sequence,
        (ends.last_position ->> fresh.receiver_id::text)::bigint - fresh.n + fresh.nth,
        'pending', fresh.expires_at, fresh.at
    FROM fresh CROSS JOIN ends
    RETURNING id, event_id, receiver_id, position
)
SELECT 'inserted', id, event_id, receiver_id, position, NULL::bigint, NULL::text FROM inserted
UNION ALL
SELECT 'behind', NULL, NULL, receiver_id, sequence, sender_id, channel
FROM held WHERE sequence < after
UNION ALL
SELECT 'unbacked', NULL, NULL, receiver_id, top, sender_id, channel FROM held WHERE unbacked
"""


def insert_deliveries(pending: list[NewDelivery]) -> list[Pushed]:
    """Insert in one statement, skipping any already there, each receiver's new ones at
    its next positions in the given order; push them once the transaction commits.
    Must run under the receivers' leaf lock, and continue each receiver's streams
    (every live event between its last and these decided). Returns what was inserted."""
    return _insert([(delivery, 0) for delivery in pending])[0]


def _insert(rows: list[tuple[NewDelivery, int]]) -> tuple[list[Pushed], dict[tuple, int]]:
    """`insert_deliveries` of (delivery, lowest last sequence it may follow) rows;
    returns also {(receiver, sender, channel): last sequence} of the receivers
    further behind than that, whose rows in that stream were left out."""
    rows = _distinct(rows)
    if not rows:
        return [], {}
    with prepared_cursor() as cursor:
        cursor.execute(INSERT_DELIVERIES, _columns(rows))
        found = cursor.fetchall()
    inserted = {
        (str(event), receiver): (row_id, at)
        for kind, row_id, event, receiver, at, _, _ in found
        if kind == "inserted"
    }
    behind = {
        (r, sender, channel): held
        for kind, _, _, r, held, sender, channel in found
        if kind == "behind"
    }
    report_unbacked([(r, s, c, top) for kind, _, _, r, top, s, c in found if kind == "unbacked"])
    pending = [delivery for delivery, _ in rows]
    pushed = [_pushed(d, inserted) for d in pending if (d.event_id, d.receiver_id) in inserted]
    pushed.sort(key=lambda p: (p.receiver_id, p.position))
    # robust: a push that fails (Redis down) is logged, not raised after the commit;
    # the agents are sent what they miss when they confirm (docs/protocol.md).
    transaction.on_commit(lambda: to_agents.push(pushed), robust=True)
    events = {p.event_id for p in pushed}
    transaction.on_commit(lambda: to_consoles.events_changed(events), robust=True)
    return pushed, behind


def _columns(rows: list[tuple[NewDelivery, int]]) -> list[str]:
    return [
        text_array(d.event_id for d, _ in rows),
        int_array(d.receiver_id for d, _ in rows),
        int_array(d.sender_id for d, _ in rows),
        text_array(d.channel for d, _ in rows),
        int_array(d.sequence for d, _ in rows),
        text_array(d.expires_at for d, _ in rows),
        text_array(d.delivered_at for d, _ in rows),
        int_array(after for _, after in rows),
    ]


def _distinct(rows: list[tuple[NewDelivery, int]]) -> list[tuple[NewDelivery, int]]:
    """One row per (event, receiver), first occurrence kept: a repeat would use up a
    position for a row that is then not inserted."""
    seen: set[tuple[str, int]] = set()
    kept = []
    for delivery, after in rows:
        key = (delivery.event_id, delivery.receiver_id)
        if key not in seen:
            seen.add(key)
            kept.append((delivery, after))
    return kept


def _pushed(delivery: NewDelivery, inserted: dict) -> Pushed:
    row_id, position = inserted[(delivery.event_id, delivery.receiver_id)]
    return Pushed(
        delivery_id=row_id,
        position=position,
        receiver_id=delivery.receiver_id,
        event_id=delivery.event_id,
        sender_id=delivery.sender_id,
        channel=delivery.channel,
        sequence=delivery.sequence,
        content=delivery.content,
    )
