"""One routing step at one dispatcher, and summary propagation.

An event enters the tree at its sender's leaf and climbs to the root. At every
dispatcher it passes it is sent down into the children whose summary may match
(except the child it came from), and at a leaf it is matched exactly and delivered.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from broker import announcements, audit
from broker.dispatch import state as dispatch_state
from broker.dispatch import wakeups
from broker.dispatch.delivery import deliver_late, deliver_routed, lock_leaf
from broker.dispatch.events import RoutedEvent, live_events, recent_policy_inputs
from broker.dispatch.summary import Summary
from broker.models import DispatcherSummary, Event, HopInbox, TrafficRecord
from broker.selectors import client_names, vocabulary

UP = TrafficRecord.Direction.UP
DOWN = TrafficRecord.Direction.DOWN


@dataclass(frozen=True)
class RouteHop:
    """Events to process next at a dispatcher."""

    dispatcher_id: int
    event_ids: list[str]
    direction: str
    came_from: int | None = None


@dataclass(frozen=True)
class SummaryHop:
    """A dispatcher must look again at a child whose summary grew."""

    dispatcher_id: int
    child_id: int
    version: int


INBOX_BATCH = 500

POP_INBOX = """
DELETE FROM broker_hopinbox WHERE id IN (
    SELECT id FROM broker_hopinbox WHERE dispatcher_id = %s
    ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED
)
RETURNING id, event_id, direction, came_from_id
"""


def drain_inbox(dispatcher_id: int) -> int:
    """Process the dispatcher's waiting hops in batches; return how many were processed.
    Each batch is one transaction: its deliveries, the hops it forwards, its traffic
    records and the removal of its inbox rows stand or fall together.

    A batch shorter than INBOX_BATCH ends the task: hops posted after the task began
    woke the dispatcher again (the task cleared its flag first)."""
    processed = 0
    while True:
        with transaction.atomic():
            if dispatcher_id not in dispatch_state.topology(dispatcher_id).leaves:
                _commit_asynchronously()
            rows = _pop_inbox(dispatcher_id)
            hops = []
            for (direction, came_from), event_ids in _grouped(rows).items():
                hops += route(dispatcher_id, event_ids, direction=direction, came_from=came_from)
            post_hops(hops)
            if rows:
                # robust: the console's tree page is told, best effort (and at most
                # once a second per process); the batch stands whatever happens.
                transaction.on_commit(announcements.tree_changed, robust=True)
        processed += len(rows)
        if len(rows) < INBOX_BATCH:
            return processed


def _pop_inbox(dispatcher_id: int) -> list[tuple]:
    """Take (and delete, in the caller's transaction) the oldest waiting hops. Rows a
    concurrent task holds are skipped, not waited for."""
    with connection.cursor() as cursor:
        cursor.execute(POP_INBOX, [dispatcher_id, INBOX_BATCH])
        return sorted(cursor.fetchall())


def _commit_asynchronously() -> None:
    """An inner dispatcher's batch only moves hops between inboxes. Should PostgreSQL
    crash before its commit reaches disk, the write-ahead log loses that commit and
    everything after it, never a part: the popped hops are back in the inbox and are
    routed again, idempotently. So the commit need not wait for the disk. Leaves write
    deliveries that are pushed right after commit, and publishing is acknowledged to
    the sender: those commit synchronously."""
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL synchronous_commit = off")


def _grouped(rows) -> dict[tuple[str, int | None], list[str]]:
    groups: dict[tuple[str, int | None], list[str]] = {}
    for _, event_id, direction, came_from in rows:
        groups.setdefault((direction, came_from), []).append(str(event_id))
    return groups


def post_hops(hops: list[RouteHop | SummaryHop]) -> None:
    """Write route hops into the next dispatchers' inboxes (in the caller's transaction)
    and wake them, and ask for summary refreshes, once it commits."""
    route_hops = [hop for hop in hops if isinstance(hop, RouteHop)]
    HopInbox.objects.bulk_create(
        HopInbox(
            dispatcher_id=hop.dispatcher_id,
            event_id=event_id,
            direction=hop.direction,
            came_from_id=hop.came_from,
        )
        for hop in route_hops
        for event_id in hop.event_ids
    )
    woken = {hop.dispatcher_id for hop in route_hops}
    summary_hops = [hop for hop in hops if isinstance(hop, SummaryHop)]
    # robust: the work is committed; a wake-up that fails (Redis down) is logged, not
    # raised to whoever committed it, and the periodic sweep wakes the dispatcher.
    transaction.on_commit(lambda: _after_commit(woken, summary_hops), robust=True)


def _after_commit(woken: set[int], summary_hops: list[SummaryHop]) -> None:
    for dispatcher_id in woken:
        wakeups.wake(wakeups.INBOX, dispatcher_id)
    for hop in summary_hops:
        wakeups.send(wakeups.REFRESH_SUMMARY, hop.dispatcher_id, hop.child_id, hop.version)


def route(dispatcher_id: int, event_ids: list[str], *, direction: str, came_from: int | None):
    """Process events at a dispatcher (inside the caller's transaction); return the
    follow-up hops."""
    tree = dispatch_state.topology(dispatcher_id)
    events = live_events(event_ids)
    hops, delivered = [], {}
    if dispatcher_id in tree.leaves:
        delivered = _deliver_at_leaf(dispatcher_id, events)
    children = [c for c in tree.children[dispatcher_id] if c != came_from]
    forwarded = _forward_down(dispatcher_id, children, events)
    hops.extend(RouteHop(child, ids, DOWN) for child, ids in forwarded.items())
    parent = tree.parent[dispatcher_id]
    if direction == UP and parent is not None and events:
        hops.append(RouteHop(parent, [e.id for e in events], UP, dispatcher_id))
    _record_traffic(dispatcher_id, events, direction, forwarded, delivered)
    if direction == UP and parent is None:
        Event.objects.filter(id__in=event_ids, routed_at__isnull=True).update(
            routed_at=timezone.now()
        )
    return hops


@contextmanager
def leaf_session(leaf_id: int):
    """A transaction holding the leaf's lock, with the leaf's state refreshed inside it.

    Yields (state, changed client ids). If anything fails, the in-memory state is
    dropped so that it is rebuilt from the database next time.
    """
    try:
        with transaction.atomic():
            lock_leaf(leaf_id)
            yield dispatch_state.leaf_state(leaf_id)
    except BaseException:
        dispatch_state.forget_leaf(leaf_id)
        raise


def _deliver_at_leaf(leaf_id: int, events: list[RoutedEvent]) -> dict[str, int]:
    with leaf_session(leaf_id) as (leaf, changed):
        counts = deliver_routed(leaf, events)
        if changed:
            deliver_late(leaf, changed)
    return counts


def _forward_down(
    dispatcher_id: int, children: list[int], events: list[RoutedEvent]
) -> dict[int, list[str]]:
    if not settings.TREE_MATCHING:  # a benchmark baseline: blind relay to every child
        return {child: [e.id for e in events] for child in children} if events else {}
    summaries = dispatch_state.summaries_of(children)
    forwarded: dict[int, list[str]] = {}
    # event id: {category: subtrees whose receivers all refuse it}
    refused: dict[str, Counter[str]] = {}
    for event in events:
        selected = [c for c in children if summaries[c].may_select(event.selector)]
        for child in selected:
            if summaries[child].may_accept(event.sender_attributes, event.content):
                forwarded.setdefault(child, []).append(event.id)
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


def _record_traffic(dispatcher_id, events, direction, forwarded, delivered) -> None:
    now = timezone.now()
    records = []
    for event in events:
        targets = sorted(child for child, ids in forwarded.items() if event.id in ids)
        count = delivered.get(event.id, 0)
        records.append(
            TrafficRecord(
                event_id=event.id,
                dispatcher_id=dispatcher_id,
                direction=direction,
                forwarded_to=targets,
                delivered=count,
                wasted=int(direction == DOWN and not targets and count == 0),
                at=now,
            )
        )
    TrafficRecord.objects.bulk_create(records)


def apply_client_changes(leaf_id: int) -> list[SummaryHop]:
    """Bring a leaf up to date, deliver what changed receivers now match, and push a
    grown summary upward; return follow-up hops."""
    with leaf_session(leaf_id) as (leaf, changed):
        if not changed:
            return []  # another task already applied these changes
        deliver_late(leaf, changed)
        # Still under the leaf's lock: a concurrent recomputation cannot interleave.
        return _store_if_grown(leaf_id, leaf.summary)


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
    """(summary before the growth, summary now). When the child has grown again since
    `version`, "before" is unknown (None) and every matching live event is resent."""
    row = DispatcherSummary.objects.filter(pk=child_id).first()
    if row is None:  # a stale request: the child has stored nothing (yet)
        return None, Summary()
    words = vocabulary()
    after = Summary.from_json(row.data, words)
    if row.version != version or row.previous_data is None:
        return None, after
    return Summary.from_json(row.previous_data, words), after


def _resend_to_grown_child(child_id: int, before: Summary | None, after: Summary) -> list:
    # Events routed while the child's old summary was in force may have skipped it.
    ids = [
        e.id
        for e in live_events()
        if after.may_match(e.selector, e.sender_attributes, e.content)
        and not (before and before.may_match(e.selector, e.sender_attributes, e.content))
    ]
    return [RouteHop(child_id, ids, DOWN)] if ids else []


def _store_if_grown(dispatcher_id: int, compute: Callable[[], Summary]) -> list[SummaryHop]:
    """Save the computed summary unless the stored one already covers it (covering
    stops propagation); if saved, the parent must hear of it."""
    with transaction.atomic():
        stored = _locked_summary_row(dispatcher_id)
        fresh = compute()
        if stored is not None and Summary.from_json(stored.data, vocabulary()).covers(fresh):
            return []
        version = _save_summary(dispatcher_id, fresh, stored)
    parent = dispatch_state.topology(dispatcher_id).parent[dispatcher_id]
    return [] if parent is None else [SummaryHop(parent, dispatcher_id, version)]


def _locked_summary_row(dispatcher_id: int) -> DispatcherSummary | None:
    """The dispatcher's summary row, locked; None if it was never stored. The row is
    created empty first if missing, so that two first stores serialise on its lock
    instead of colliding."""
    DispatcherSummary.objects.get_or_create(
        dispatcher_id=dispatcher_id, defaults={"version": 0, "data": Summary().to_json()}
    )
    stored = DispatcherSummary.objects.select_for_update().get(pk=dispatcher_id)
    return stored if stored.version > 0 else None


def _save_summary(dispatcher_id: int, summary: Summary, stored: DispatcherSummary | None) -> int:
    """Store a new version, keeping the one it replaces, with its figures; return the
    new version."""
    figures = summary.figures(recent_policy_inputs)
    if stored is None:
        DispatcherSummary.objects.filter(pk=dispatcher_id).update(
            version=1, data=summary.to_json(), previous_data=None, **figures
        )
        return 1
    stored.previous_data = stored.data
    stored.version += 1
    stored.data = summary.to_json()
    for name, value in figures.items():
        setattr(stored, name, value)
    stored.save(update_fields=["version", "data", "previous_data", "updated_at", *figures])
    return stored.version


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
        return _replace_summary(leaf_id, leaf.summary)


def _recompute_inner(dispatcher_id: int, children: list[int]) -> list[SummaryHop]:
    # Children are read after our row is locked, so the union is of their latest.
    return _replace_summary(
        dispatcher_id, lambda: Summary.union(dispatch_state.summaries_of(children).values())
    )


def _replace_summary(dispatcher_id: int, compute: Callable[[], Summary]) -> list[SummaryHop]:
    with transaction.atomic():
        stored = _locked_summary_row(dispatcher_id)
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
