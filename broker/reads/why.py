"""Why a client did or did not get an event: the matcher's three checks clause by
clause on the values as they were (the receiver's attributes, its policy, the sender's
attested attributes and the content), what became of the delivery, and the way the
event took through the dispatcher tree toward the client's leaf.

The moment that matters is when the receiver got the event (a standing command can
come to match later), or else when the event was published. Reads only.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.utils import timezone

from broker.models import (
    ArchivedEvent,
    Client,
    Delivery,
    Dispatcher,
    Event,
    PolicyVersion,
    TrafficRecord,
)
from broker.reads.clients import current_attributes
from broker.reads.deliveries import deliveries_of
from broker.reads.history import (
    Lapse,
    Provenance,
    attributes_as_of,
    history_kept_from,
    lapsed_as_of,
    policy_as_of,
)
from broker.reads.policies import current_policy
from broker.vocabulary import stored_selector, vocabulary
from policies import Policy, Selector
from policies.explain import (
    BranchCheck,
    ClauseCheck,
    Verdict,
    check_policy,
    check_selector,
    describe_value,
)
from policies.expressions import EVENT, RECEIVER, SENDER

# What each scope of a constraint is called on the page.
PART_OF_SCOPE = {RECEIVER: "receiver", SENDER: "sender", EVENT: "content"}


@dataclass(frozen=True)
class ClauseRow:
    """One constraint as tested, and where the tested value came from (None: the
    value is the event's content, or its provenance is not recorded)."""

    check: ClauseCheck
    provenance: Provenance | None
    lapse: Lapse | None = None  # a missing sender value: how it had lapsed

    @property
    def part(self) -> str:
        """ "receiver", "sender" or "content"."""
        return PART_OF_SCOPE[self.check.scope]

    def __str__(self) -> str:
        if self.lapse is None:
            return str(self.check)
        lapse = self.lapse
        when = lapse.at.strftime("%Y-%m-%d %H:%M:%S")
        was = f"{describe_value(lapse.held.value)} from {lapse.held.authority or 'itself'}"
        missing = f"{self.check.attribute} is missing: its {was} {lapse.how} at {when}"
        return f"{self.check.text} ({missing})"


@dataclass(frozen=True)
class BranchRows:
    """One branch of a rule: it holds if every row holds."""

    text: str
    holds: bool
    rows: tuple[ClauseRow, ...]

    @property
    def failing(self) -> tuple[ClauseRow, ...]:
        return tuple(row for row in self.rows if not row.check.holds)


@dataclass(frozen=True)
class RuleCheck:
    """A selector or a policy checked: the verdict and its branches as rows."""

    verdict: Verdict
    branches: tuple[BranchRows, ...]

    @property
    def holds(self) -> bool:
        return self.verdict.holds

    @property
    def nearest(self) -> BranchRows | None:
        """The branch that held, or else the one with fewest failing clauses: what an
        operator would have to change (None: the rule accepts nothing)."""
        if not self.branches:
            return None
        return min(self.branches, key=lambda branch: (not branch.holds, len(branch.failing)))

    @property
    def failing_text(self) -> str:
        """The nearest branch's failing clauses with their values ("" if it holds)."""
        branch = self.nearest
        if branch is None:
            return "it accepts nothing"
        return ", ".join(str(row) for row in branch.failing)


@dataclass(frozen=True)
class SentAttribute:
    """One of the sender's attested attributes stored with the event, and who
    attested it, when, until when (None: not in the attribute history)."""

    name: str
    value: Any
    provenance: Provenance | None


@dataclass(frozen=True)
class SelectorPart:
    """The selector against the receiver's attributes as they were at `moment`."""

    text: str  # "" when the event has none: every receiver is a candidate
    moment: datetime
    attributes: dict[str, Provenance]
    check: RuleCheck
    now: RuleCheck | None  # against today's attributes, if the event is still live


@dataclass(frozen=True)
class PolicyPart:
    """The receiver's policy at `moment` against the sender's attested attributes
    (sender clauses) and the event's content (content clauses)."""

    version: PolicyVersion | None  # None: it had no policy, and accepted nothing
    sender_attributes: tuple[SentAttribute, ...]
    check: RuleCheck | None
    now: RuleCheck | None  # today's policy, if the event is still live

    @property
    def holds(self) -> bool:
        return self.check is not None and self.check.holds


@dataclass(frozen=True)
class Hop:
    """The event at one dispatcher on the way toward the receiver's leaf."""

    dispatcher: str
    direction: str
    at: datetime
    forwarded_to: tuple[str, ...]
    delivered: int
    wasted: int
    toward_receiver: bool  # it went on to the next dispatcher of the way (or delivered)
    climbed_to: str | None  # the parent an upward hop passed it on to


@dataclass(frozen=True)
class Route:
    """The event's hops from the sender's leaf up and down to the receiver's leaf, in
    path order, and how many hops it made in all."""

    hops: tuple[Hop, ...]
    leaf: str | None  # the receiver's leaf (None: it is on none)
    total_hops: int

    @property
    def reached_leaf(self) -> bool:
        return any(hop.dispatcher == self.leaf for hop in self.hops)

    @property
    def stopped_at(self) -> str | None:
        """The last dispatcher the event reached on the way, if it went no further."""
        if self.reached_leaf or not self.hops:
            return None
        return self.hops[-1].dispatcher


@dataclass(frozen=True)
class Why:
    """Everything that decided whether `client` got `event`."""

    event: Event
    client: Client
    selector: SelectorPart
    policy: PolicyPart | None  # None: the client is not a receiver
    delivery: Delivery | None
    route: Route
    live: bool
    came_later: bool  # delivered, though it did not match when the event was published
    # Retention dropped the event's deliveries: whether this one was among them is in
    # the reports' dataset, not here (the checks still say whether it matched).
    archived: bool = False
    # Retention dropped the attribute history before this moment (the moment of the
    # checks is earlier): the checks read none of the values of then.
    history_kept_from: datetime | None = None

    @property
    def delivered(self) -> bool:
        return self.delivery is not None

    @property
    def moment_is(self) -> str:
        """What the moment of the checks is."""
        return "when it was delivered" if self.delivered else "when the event was published"

    @property
    def summary(self) -> str:
        """The verdict in one plain sentence."""
        return f"{self.client.name} {_verdict_words(self)}"


def why(event: Event, client: Client) -> Why:
    """Explain whether `client` got `event` and why, on the values as they were."""
    delivery = deliveries_of(event).filter(receiver=client).first()
    moment = delivery.delivered_at if delivery else event.published_at
    live = event.expires_at > timezone.now()
    selector = stored_selector(event.selector, vocabulary())
    policy = _policy_part(event, client, moment, live) if client.can_receive else None
    came_later = delivery is not None and not _matched_at_publish(event, client, selector)
    return Why(
        event=event,
        client=client,
        selector=_selector_part(event, client, selector, moment, live),
        policy=policy,
        delivery=delivery,
        route=route_to(event, client, delivered_there=delivery is not None and not came_later),
        live=live,
        came_later=came_later,
        archived=ArchivedEvent.objects.filter(event=event).exists(),
        history_kept_from=_history_dropped_before(moment),
    )


def _history_dropped_before(moment: datetime) -> datetime | None:
    """Where the attribute history kept starts, if `moment` is before it."""
    kept_from = history_kept_from()
    return kept_from if kept_from is not None and moment < kept_from else None


def _matched_at_publish(event: Event, client: Client, selector: Selector | None) -> bool:
    """Did the receiver match the event as it was when the event was published?"""
    held = attributes_as_of(client, event.published_at)
    values = {name: provenance.value for name, provenance in held.items()}
    version = policy_as_of(client, event.published_at)
    return (
        check_selector(selector, values).holds
        and version is not None
        and check_policy(_policy(version), event.sender_attributes, event.content).holds
    )


def _selector_part(
    event: Event, client: Client, selector: Selector | None, moment: datetime, live: bool
) -> SelectorPart:
    attributes = attributes_as_of(client, moment)
    values = {name: held.value for name, held in attributes.items()}
    verdict = check_selector(selector, values)
    now = None
    if live:
        today = current_attributes(client)
        now = _rows(check_selector(selector, today), {})
    return SelectorPart(event.selector, moment, attributes, _rows(verdict, attributes), now)


def _policy_part(event: Event, client: Client, moment: datetime, live: bool) -> PolicyPart:
    sent = _sent_attributes(event)
    provenance = {a.name: a.provenance for a in sent if a.provenance is not None}
    version = policy_as_of(client, moment)
    check = None
    if version is not None:
        verdict = check_policy(_policy(version), event.sender_attributes, event.content)
        check = _rows(verdict, provenance, _lapses(event, verdict))
    return PolicyPart(version, sent, check, _policy_now(event, client) if live else None)


def _policy(version: PolicyVersion) -> Policy:
    # As the leaves read it: the canonical text, typed by today's vocabulary.
    return vocabulary().stored_policy(version.canonical_text)


def _policy_now(event: Event, client: Client) -> RuleCheck | None:
    version = current_policy(client)
    if version is None:
        return None
    return _rows(check_policy(_policy(version), event.sender_attributes, event.content), {})


def _sent_attributes(event: Event) -> tuple[SentAttribute, ...]:
    """The sender's attested attributes as stored with the event (what policies
    tested), each with its provenance from the sender's history at publish time."""
    held = attributes_as_of(event.sender, event.published_at)
    return tuple(
        SentAttribute(name, value, _same_value(held.get(name), value))
        for name, value in sorted(event.sender_attributes.items())
    )


def _same_value(held: Provenance | None, value: Any) -> Provenance | None:
    # History older than the history itself (backfilled) may disagree: then unknown.
    return held if held is not None and held.attested and held.value == value else None


def _lapses(event: Event, verdict: Verdict) -> dict[str, Lapse]:
    """How the sender's attributes a policy tested but the event lacked had lapsed
    (expired or revoked) by the time it was sent."""
    missing = {
        check.name
        for branch in verdict.branches
        for check in branch.checks
        if check.scope == SENDER and check.value is None
    }
    return lapsed_as_of(event.sender, event.published_at, missing) if missing else {}


def _rows(
    verdict: Verdict, provenance: dict[str, Provenance], lapses: dict[str, Lapse] | None = None
) -> RuleCheck:
    rows = [_branch_rows(branch, provenance, lapses or {}) for branch in verdict.branches]
    return RuleCheck(verdict, tuple(rows))


def _branch_rows(
    branch: BranchCheck, provenance: dict[str, Provenance], lapses: dict[str, Lapse]
) -> BranchRows:
    rows = tuple(
        ClauseRow(
            check,
            provenance.get(check.name) if check.scope != EVENT else None,
            lapses.get(check.name) if check.scope == SENDER and check.value is None else None,
        )
        for check in branch.checks
    )
    return BranchRows(branch.text, branch.holds, rows)


# ---------------------------------------------------------------------------
# The way through the tree.


def route_to(event: Event, receiver: Client, *, delivered_there: bool) -> Route:
    """The event's traffic records on the way from its sender's leaf up to where the
    two leaves' branches meet, then down to the receiver's leaf, in path order (a
    dispatcher visited twice, a resend after its summary grew, shows twice).
    `delivered_there`: the receiver's leaf delivered it to the receiver on arrival."""
    total = TrafficRecord.objects.filter(event=event).count()
    if receiver.dispatcher_id is None or event.sender.dispatcher_id is None:
        return Route((), None, total)
    names, parents = _tree()
    up, down = _way(parents, event.sender.dispatcher_id, receiver.dispatcher_id)
    records = list(
        TrafficRecord.objects.filter(event=event, dispatcher_id__in=[*up, *down]).order_by(
            "at", "pk"
        )
    )
    path = [r for d in up for r in records if (r.dispatcher_id, r.direction) == (d, "up")]
    path += [r for d in down for r in records if (r.dispatcher_id, r.direction) == (d, "down")]
    way = [*up, *down]
    hops = tuple(_hop(record, names, parents, way, delivered_there) for record in path)
    return Route(hops, names[receiver.dispatcher_id], total)


def _tree() -> tuple[dict[int, str], dict[int, int | None]]:
    rows = Dispatcher.objects.values_list("pk", "name", "parent_id")
    return {pk: name for pk, name, _ in rows}, {pk: parent for pk, _, parent in rows}


def _way(parents: dict, sender_leaf: int, receiver_leaf: int) -> tuple[list[int], list[int]]:
    """(dispatchers going up from the sender's leaf to the meeting point, included;
    dispatchers going down from below it to the receiver's leaf)."""
    climbing = _ancestors(parents, sender_leaf)
    descending = _ancestors(parents, receiver_leaf)
    meeting = next(d for d in climbing if d in descending)
    up = climbing[: climbing.index(meeting) + 1]
    down = list(reversed(descending[: descending.index(meeting)]))
    return up, down


def _ancestors(parents: dict, dispatcher_id: int) -> list[int]:
    chain = [dispatcher_id]
    while parents.get(chain[-1]) is not None:
        chain.append(parents[chain[-1]])
    return chain


def _hop(record: TrafficRecord, names: dict, parents: dict, way: list, delivered: bool) -> Hop:
    position = way.index(record.dispatcher_id)
    following = way[position + 1] if position + 1 < len(way) else None
    parent = parents[record.dispatcher_id]
    climbed_to = names[parent] if record.direction == "up" and parent is not None else None
    if following is None:  # the receiver's leaf
        onward = delivered
    else:  # climbing goes on to the parent; descending, to the children forwarded to
        onward = following in record.forwarded_to or (climbed_to and following == parent)
    return Hop(
        dispatcher=names[record.dispatcher_id],
        direction=record.direction,
        at=record.at,
        forwarded_to=tuple(names[d] for d in record.forwarded_to if d in names),
        delivered=record.delivered,
        wasted=record.wasted,
        toward_receiver=bool(onward),
        climbed_to=climbed_to,
    )


# ---------------------------------------------------------------------------
# The verdict in words.


def _verdict_words(found: Why) -> str:
    if found.delivered:
        return _delivered_words(found)
    if found.archived:
        return (
            "may have got it: the event's deliveries were removed by retention, and whether"
            " it had one is in the reports (the reach report of the minute it was sent)"
        )
    if found.history_kept_from:
        return (
            "did not get it, and why cannot be told here: its attributes then were removed"
            " by retention (the reports' dataset holds them)"
        )
    reason = _refusal(found)
    return f"did not get it: {reason}"


def _delivered_words(found: Why) -> str:
    delivery = found.delivery
    when = _time(delivery.delivered_at)
    later = " (it came to match after the event was published)" if found.came_later else ""
    return f"got it: delivered at {when}{later}, {_state_words(delivery)}"


def _state_words(delivery: Delivery) -> str:
    words = {
        Delivery.State.PENDING: "not yet confirmed by its agent",
        Delivery.State.DELIVERED: "its agent has it and has not answered",
        Delivery.State.ACKED: "its agent acknowledged it",
        Delivery.State.FAILED: "its agent answered that it failed",
        Delivery.State.EXPIRED: "the event expired before its agent confirmed it",
    }
    return words.get(delivery.state, delivery.state)


def _refusal(found: Why) -> str:
    if not found.client.can_receive:
        return "it is not a receiver (it only sends)"
    if not found.selector.check.holds:
        return "the selector did not select it: " + found.selector.check.failing_text
    policy = found.policy
    if policy.version is None:
        return "it had no policy then, and a receiver without one accepts nothing"
    if not policy.check.holds:
        return f"its policy refused the {_refused_parts(policy.check)}: {policy.check.failing_text}"
    return _unexplained(found)


def _refused_parts(check: RuleCheck) -> str:
    branch = check.nearest
    parts = {row.part for row in branch.failing} if branch else {"sender"}
    return " and ".join(p for p in ("sender", "content") if p in parts)


def _unexplained(found: Why) -> str:
    """Both checks pass on the values then, yet nothing was delivered."""
    if not found.client.is_active:
        return "both checks pass, but it is deactivated"
    if found.client.dispatcher_id is None:
        return "both checks pass, but it is on no leaf of the dispatcher tree"
    if found.live and found.event.routed_at is None:
        return "both checks pass; the event is still on its way through the tree"
    stopped = found.route.stopped_at
    where = f"; the event went no further toward it than {stopped}" if stopped else ""
    return f"both checks pass on what it held then, yet no delivery was recorded{where}"


def _time(moment: datetime) -> str:
    return timezone.localtime(moment).strftime("%Y-%m-%d %H:%M:%S")
