"""One routing step at one dispatcher, and summary propagation.

An event enters the tree at its sender's leaf and climbs to the root. At every
dispatcher it passes it is sent down into the children whose summary may match
(except the child it came from), and at a leaf it is matched exactly and delivered.
Hops travel as Redis stream entries (broker/dispatch/transport.py, read by
broker/dispatch/consumer.py); only leaves (deliveries) and the root (the routed mark)
write to PostgreSQL.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import Q
from django.utils import timezone

from broker import audit
from broker.dispatch import state as dispatch_state
from broker.dispatch import transport, wakeups
from broker.dispatch.delivery import deliver_late, deliver_routed
from broker.dispatch.routed import (
    LiveSelectors,
    RoutedEvent,
    live_events,
    live_selectors,
    recent_policy_inputs,
    wire_of,
)
from broker.dispatch.summary import Summary
from broker.dispatch.transport import RouteHop
from broker.models import DispatcherSummary, Event, SummaryVersion, TrafficRecord
from broker.prepared import prepared_cursor
from broker.reads.clients import client_names
from broker.vocabulary import FRESH_FOR_S, STAMP_COLUMNS, stamp_of, vocabulary, vocabulary_at

UP = TrafficRecord.Direction.UP
DOWN = TrafficRecord.Direction.DOWN
# Processes route with summaries read at most FRESH_FOR_S ago: after twice that (the
# read, and a margin as long for the hop already on its way), a grown summary is in
# force in every one of them.
SUMMARY_IN_FORCE_AFTER_S = 2 * FRESH_FOR_S


@dataclass(frozen=True)
class SummaryHop:
    """A dispatcher must look again at a child whose summary grew."""

    dispatcher_id: int
    child_id: int
    version: int


def post_hops(hops: list[RouteHop | SummaryHop]) -> None:
    """Send route hops at once, and ask for summary refreshes once the caller's
    transaction commits.

    Route hops posted here resend events that are committed already, so sending them
    before the commit is safe: should the transaction roll back, they are repeats,
    which delivery ignores; should the process die before sending, the task that
    produced them runs again."""
    transport.send(hop for hop in hops if isinstance(hop, RouteHop))
    summary_hops = [hop for hop in hops if isinstance(hop, SummaryHop)]
    if summary_hops:
        # robust: a request that fails (Redis down) is logged, not raised to whoever
        # committed; the periodic recomputation catches the summary up.
        transaction.on_commit(lambda: _ask_for_refreshes(summary_hops), robust=True)


def _ask_for_refreshes(summary_hops: list[SummaryHop]) -> None:
    for hop in summary_hops:
        wakeups.send(wakeups.REFRESH_SUMMARY, hop.dispatcher_id, hop.child_id, hop.version)


def route(
    dispatcher_id: int, events: list[RoutedEvent], *, direction: str, came_from: int | None
) -> list[tuple]:
    """Process events at a dispatcher: send them on (before anything else, for speed:
    a repeat is harmless), deliver them if it is a leaf, mark them routed at the root.
    Returns their traffic records, for `traffic.record`."""
    tree = dispatch_state.topology(dispatcher_id)
    now = timezone.now()
    events = [e for e in events if e.expires_at > now]
    if not events:
        return []
    children = [c for c in tree.children[dispatcher_id] if c != came_from]
    forwarded = _forward_down(dispatcher_id, children, events)
    hops = [RouteHop(child, [wire_of(e) for e in sent], DOWN) for child, sent in forwarded.items()]
    parent = tree.parent[dispatcher_id]
    if direction == UP and parent is not None:
        hops.append(RouteHop(parent, [wire_of(e) for e in events], UP, dispatcher_id))
    transport.send(hops)
    delivered = _deliver_at_leaf(dispatcher_id, events) if dispatcher_id in tree.leaves else {}
    if direction == UP and parent is None:
        _mark_routed([e.id for e in events])
    # Stamped when routing began: the next dispatcher may record its hop before this
    # one's deliveries are written, and a route's records must read in order.
    return _traffic(dispatcher_id, events, direction, forwarded, delivered, now)


# The root has sent these events down: they did not lose their way. One statement,
# its own transaction when alone (the root runs it for every event it routes).
MARK_ROUTED = """
UPDATE broker_event SET routed_at = %s
WHERE id = ANY(%s::uuid[]) AND routed_at IS NULL
"""


def _mark_routed(event_ids: list[str]) -> None:
    """Only the sweep reads the mark (`entry.send_unrouted_events`)."""
    with prepared_cursor() as cursor:
        cursor.execute(MARK_ROUTED, [timezone.now(), event_ids])


@contextmanager
def leaf_session(leaf_id: int):
    """The leaf's lock held, with the leaf's state refreshed under it.

    Yields (state, changed client ids). Inside the caller's transaction, the lock and
    the block are a transaction (a savepoint) of their own; outside any, as the tree's
    hops run, the session holds the lock and each statement commits by itself: every
    write under the lock is one statement that stands alone (a delivery's rows and
    its stream's counter are one insert), so there is no transaction to wait for. If
    anything fails, the in-memory state is dropped so that it is rebuilt from the
    database next time (and every receiver caught up).
    """
    try:
        if connection.in_atomic_block:
            with transaction.atomic():
                yield dispatch_state.locked_leaf_state(leaf_id)
        else:
            with dispatch_state.leaf_held(leaf_id) as held:
                yield held
    except BaseException:
        dispatch_state.forget_leaf(leaf_id)
        raise


def _deliver_at_leaf(leaf_id: int, events: list[RoutedEvent]) -> dict[str, int]:
    try:
        return _deliver_in_leaf_session(leaf_id, events)
    except IntegrityError:
        # An event deleted after it was sent (its sender's data purged, a test's
        # database emptied): deliver the others.
        found = Event.objects.filter(id__in=[e.id for e in events]).values_list("id", flat=True)
        existing = {str(event_id) for event_id in found}
        if len(existing) == len(events):
            raise
        return _deliver_in_leaf_session(leaf_id, [e for e in events if e.id in existing])


def _deliver_in_leaf_session(leaf_id: int, events: list[RoutedEvent]) -> dict[str, int]:
    with leaf_session(leaf_id) as (leaf, changed):
        counts = deliver_routed(leaf, events)
        if changed:
            deliver_late(leaf, changed)
    return counts


def _forward_down(
    dispatcher_id: int, children: list[int], events: list[RoutedEvent]
) -> dict[int, list[RoutedEvent]]:
    if not children:
        return {}
    if not settings.TREE_MATCHING:  # a benchmark baseline: blind relay to every child
        return {child: list(events) for child in children}
    summaries = dispatch_state.routing_summaries(children)
    forwarded: dict[int, list[RoutedEvent]] = {}
    # event id: {category: subtrees whose receivers all refuse it}
    refused: dict[str, Counter[str]] = {}
    for event in events:
        selected = [c for c in children if summaries[c].may_select(event.selector)]
        for child in selected:
            if summaries[child].may_accept(event.sender_attributes, event.content):
                forwarded.setdefault(child, []).append(event)
            else:
                category = audit.policy_refusal_category(
                    summaries[child].policy_filters, event.sender_attributes
                )
                refused.setdefault(event.id, Counter())[category] += 1
    if refused:
        _audit_refused_subtrees(dispatcher_id, [e for e in events if e.id in refused], refused)
    return forwarded


def _audit_refused_subtrees(
    dispatcher_id: int, events: list[RoutedEvent], subtrees: dict[str, Counter[str]]
) -> None:
    """The senders addressed receivers below, but none of their policies accepts it
    (the senders named, in one query), one entry per event and kind of refusal.

    A summary over-approximates its receivers' policies: when even it refuses the
    sender whatever the content, every policy below does (sender not qualified);
    when it admits the sender, its content clauses refused, though some receivers'
    own policies below may refuse the sender too (counted as content filtered)."""
    senders = client_names({event.sender_id for event in events})
    for event in events:
        for category, count in sorted(subtrees[event.id].items()):
            audit.record_refusal(
                actor=audit.Actor("client", senders.get(event.sender_id, str(event.sender_id))),
                action="event.refused_by_policy",
                target=f"event:{event.id}",
                reason="no receiver policy below this dispatcher accepts this sender and content",
                details={"dispatcher": dispatcher_id, "category": category, "subtrees": count},
            )


def _traffic(dispatcher_id, events, direction, forwarded, delivered, now) -> list[tuple]:
    targets_of: dict[str, list[int]] = {}
    for child, sent in sorted(forwarded.items()):
        for event in sent:
            targets_of.setdefault(event.id, []).append(child)
    rows = []
    for event in events:
        targets = targets_of.get(event.id, [])
        count = delivered.get(event.id, 0)
        wasted = int(direction == DOWN and not targets and count == 0)
        rows.append((event.id, dispatcher_id, direction, targets, count, wasted, now))
    return rows


def apply_client_changes(leaf_id: int) -> list[SummaryHop]:
    """Bring a leaf up to date, deliver what changed receivers now match, and push a
    grown summary upward; return follow-up hops."""
    with leaf_session(leaf_id) as (leaf, changed):
        if changed:
            deliver_late(leaf, changed)
        # Even with nothing new to take in: a hop may have taken the changes in before
        # (delivering, it does not store summaries). Still under the leaf's lock, so a
        # concurrent recomputation cannot interleave. Whether the stored summary grows
        # is asked of the receivers changed since it last covered them, not of every
        # receiver: a fleet's load reports change a few clients at a time.
        hops = _store_if_grown(leaf_id, leaf.summary, changed=leaf.unsummarised_summary())
        leaf.summarised()
        return hops


def refresh_summary(dispatcher_id: int, child_id: int, version: int) -> list[RouteHop | SummaryHop]:
    """A child's summary grew to `version`: send it the live events it may now match,
    and grow ours if needed; return follow-up hops."""
    tree = dispatch_state.topology(dispatcher_id)
    children = tree.children[dispatcher_id]
    before, after = _grown_summary(child_id, version)
    hops = _resend_to_grown_child(child_id, before, after)
    # The union is computed after our row is locked, from the children's latest.
    union = lambda: Summary.union(dispatch_state.summaries_of(children).values())  # noqa: E731
    return hops + _store_if_grown(dispatcher_id, union)


def _grown_summary(child_id: int, version: int) -> tuple[Summary | None, Summary]:
    """(the child's summary before `version`, the summary at `version`), as kept
    (`SummaryVersion`). Where `version` is no longer kept (or the child stored nothing),
    "before" is unknown (None) and the summary is the child's latest: every live event
    it may match is resent."""
    kept = dict(
        SummaryVersion.objects.filter(
            dispatcher_id=child_id, version__in=[version - 1, version]
        ).values_list("version", "data")
    )
    words = vocabulary()
    if version not in kept:
        row = DispatcherSummary.objects.filter(pk=child_id).first()
        return None, Summary.from_json(row.data, words) if row else Summary()
    before, grown = kept.get(version - 1), kept[version]
    return (Summary.from_json(before, words) if before else None), Summary.from_json(grown, words)


def _resend_to_grown_child(child_id: int, before: Summary | None, after: Summary) -> list:
    # Events routed while the child's old summary was in force may have skipped it.
    texts = _selectors_the_growth_concerns(before, after, live_selectors())
    resent = [
        wire_of(e)
        for e in (live_events(selector__in=texts) if texts else [])
        if after.may_match(e.selector, e.sender_attributes, e.content)
        and not (before and before.may_match(e.selector, e.sender_attributes, e.content))
    ]
    return [RouteHop(child_id, resent, DOWN)] if resent else []


def _selectors_the_growth_concerns(
    before: Summary | None, after: Summary, live: LiveSelectors
) -> list[str]:
    """The selectors (as stored) of the live events a child's growth may concern: those
    the grown summary may select, unless the old one could select them too and the
    growth left the policies' side as it was (the old summary let those events through
    already). Reading every live event at each growth took 90 ms a time in the
    50-ponger ping-pong, whose pongers' load changes grow summaries every 10 s."""
    policies_grew = before is None or not before.accepts_all_of(after)
    concerned = []
    for text in live.streams:
        selector = live.typed(text)
        if after.may_select(selector) and (policies_grew or not before.may_select(selector)):
            concerned.append(text)
    return concerned


def _store_if_grown(
    dispatcher_id: int, compute: Callable[[], Summary], *, changed: Summary | None = None
) -> list[SummaryHop]:
    """Save the computed summary unless the stored one already covers it, or covers
    `changed` (the part of it that may have grown since it was last covered): covering
    stops propagation. If saved, the parent must hear of it.

    `changed` is given by a leaf's pass only, under the leaf's lock, the only lock under
    which a leaf's summary is written: whether the row covers the change is asked
    without locking the row (a row lock is a write, and its commit a flush of the
    write-ahead log, at every pass of every leaf)."""
    if changed is not None:
        stored = _summary_row(dispatcher_id)
        if stored is not None and _stored_summary(stored).covers(changed):
            return []
    with transaction.atomic():
        stored = _summary_row(dispatcher_id, lock=True)
        kept = None if stored is None else _stored_summary(stored)
        fresh = compute()
        if kept is not None and kept.covers(fresh):
            return []
        if kept is not None:
            fresh = fresh.with_moved_numbers_as_ranges(kept)
        version = _save_summary(dispatcher_id, fresh, stored)
    parent = dispatch_state.topology(dispatcher_id).parent[dispatcher_id]
    return [] if parent is None else [SummaryHop(parent, dispatcher_id, version)]


# The summary row without its data, with the vocabulary's stamp: every leaf pass reads
# it (the ORM's query, built each time, was a tenth of an idle tree worker).
SUMMARY_ROW = f"""
SELECT {", ".join(f.column for f in DispatcherSummary._meta.concrete_fields if f.name != "data")},
       {STAMP_COLUMNS}
FROM {DispatcherSummary._meta.db_table} WHERE dispatcher_id = %s
"""


def _summary_row(dispatcher_id: int, *, lock: bool = False) -> DispatcherSummary | None:
    """The dispatcher's summary row without its data (`_stored_summary`), locked if
    `lock`; None if it was never stored. To be locked, the row is created empty first if
    missing, so that two first stores serialise on its lock instead of colliding."""
    statement = SUMMARY_ROW + " FOR UPDATE" if lock else SUMMARY_ROW
    stored = next(iter(DispatcherSummary.objects.raw(statement, [dispatcher_id])), None)
    if stored is None and lock:
        DispatcherSummary.objects.get_or_create(
            dispatcher_id=dispatcher_id, defaults={"version": 0, "data": Summary().to_json()}
        )
        stored = next(iter(DispatcherSummary.objects.raw(statement, [dispatcher_id])))
    return stored if stored is not None and stored.version > 0 else None


# {dispatcher id: (row's version, its updated_at, vocabulary, the summary parsed)}: the
# stored summary this process last read of each dispatcher. A leaf takes its clients'
# changes in every second under a fleet's load reports, and reading its stored summary's
# JSON again each time (Django decodes it, then Summary parses it) was a seventh of an
# idle tree worker.
_parsed: dict[int, tuple] = {}


def _stored_summary(stored: DispatcherSummary) -> Summary:
    """The summary of the locked row `stored` (read without its data), parsed once per
    version of the row and vocabulary (equal vocabularies parse it alike)."""
    words = vocabulary_at(stamp_of(stored))
    read_as = (stored.version, stored.updated_at, words)
    cached = _parsed.get(stored.pk)
    if cached is not None and cached[:3] == read_as:
        return cached[3]
    data = DispatcherSummary.objects.filter(pk=stored.pk).values_list("data", flat=True).get()
    summary = Summary.from_json(data, words)
    _parsed[stored.pk] = (*read_as, summary)
    return summary


def _save_summary(dispatcher_id: int, summary: Summary, stored: DispatcherSummary | None) -> int:
    """Store a new version, with its figures, and keep it (`SummaryVersion`); return
    the new version."""
    figures = summary.figures(recent_policy_inputs)
    data = summary.to_json()
    if stored is None:
        DispatcherSummary.objects.filter(pk=dispatcher_id).update(version=1, data=data, **figures)
        version = 1
    else:
        stored.version += 1
        stored.data = data
        for name, value in figures.items():
            setattr(stored, name, value)
        stored.save(update_fields=["version", "data", "updated_at", *figures])
        version = stored.version
    _keep_version(dispatcher_id, version, data)
    return version


def _keep_version(dispatcher_id: int, version: int, data: dict) -> None:
    """Keep this version, and only the last KEPT (a summary row stored afresh starts
    at version 1 again: what was kept of the old one goes)."""
    kept = SummaryVersion.objects.filter(dispatcher_id=dispatcher_id)
    kept.filter(Q(version__lte=version - SummaryVersion.KEPT) | Q(version__gte=version)).delete()
    SummaryVersion.objects.create(dispatcher_id=dispatcher_id, version=version, data=data)


def _refresh_figures(stored: DispatcherSummary, summary: Summary) -> None:
    """The summary is unchanged, but its loss is measured again on the events of now
    (and figures missing from a summary stored before they were kept are filled in),
    without a new version: workers' cached copies stay valid."""
    figures = summary.figures(recent_policy_inputs)
    if any(getattr(stored, name) != value for name, value in figures.items()):
        DispatcherSummary.objects.filter(pk=stored.pk).update(**figures)


def recompute_summaries() -> list[SummaryHop]:
    """Replace every summary by the exact one, bottom-up (they may shrink). Run on an
    interval: grown-only summaries drift wider over time. Where one grew instead, its
    parent is told, as after any growth; those hops are returned."""
    tree = dispatch_state.topology()
    hops: list[SummaryHop] = []
    for dispatcher_id in sorted(tree.parent, key=lambda d: -_depth(tree, d)):
        if dispatcher_id in tree.leaves:
            hops += _recompute_leaf(dispatcher_id)
        else:
            hops += _recompute_inner(dispatcher_id, tree.children[dispatcher_id])
    return hops


def _recompute_leaf(leaf_id: int) -> list[SummaryHop]:
    # Under the leaf's lock, so that a change applied meanwhile is not overwritten.
    with leaf_session(leaf_id) as (leaf, changed):
        if changed:
            deliver_late(leaf, changed)
        hops = _replace_summary(leaf_id, leaf.summary)
        leaf.summarised()
        return hops


def _recompute_inner(dispatcher_id: int, children: list[int]) -> list[SummaryHop]:
    # Children are read after our row is locked, so the union is of their latest.
    return _replace_summary(
        dispatcher_id, lambda: Summary.union(dispatch_state.summaries_of(children).values())
    )


def _replace_summary(dispatcher_id: int, compute: Callable[[], Summary]) -> list[SummaryHop]:
    with transaction.atomic():
        stored = _summary_row(dispatcher_id, lock=True)
        summary = compute()
        if stored is not None and stored.data == summary.to_json():
            _refresh_figures(stored, summary)
            return []
        grew = stored is None or not Summary.from_json(stored.data, vocabulary()).covers(summary)
        version = _save_summary(dispatcher_id, summary, stored)
    parent = dispatch_state.topology(dispatcher_id).parent[dispatcher_id]
    return [SummaryHop(parent, dispatcher_id, version)] if grew and parent is not None else []


def _depth(tree, dispatcher_id: int) -> int:
    depth = 0
    while tree.parent[dispatcher_id] is not None:
        dispatcher_id = tree.parent[dispatcher_id]
        depth += 1
    return depth
