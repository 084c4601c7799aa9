"""Who an event reaches and how it travels: verdicts per group of receivers, then the
event's hops through the tree as broker.dispatch.steps makes them, with the refusals
its leaves and dispatchers audit on the way.

An event enters at its sender's leaf and climbs to the root; every dispatcher on the
way sends it down into the other children whose subtree holds a receiver that accepts
it (a summary over-approximates now and then: the event goes down into a leaf where
nobody takes it, a wasted hop). A leaf delivers to its receivers that are selected and
accept, and audits those that are selected and refuse.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import Counter
from dataclasses import dataclass, field
from itertools import islice

from broker.audit import CONTENT_FILTERED, MAX_LISTED_NAMES, SENDER_NOT_QUALIFIED
from broker.dispatch.delivery import REFUSAL_REASONS
from demo.synthetic.clock import MS, US
from demo.synthetic.records import AuditRows
from demo.synthetic.roster import Fleet, Group, Receiver, Tree

UP, DOWN = "up", "down"
HOP_LATENCY_MEDIAN_S = 0.004
HOP_LATENCY_SIGMA = 0.9
PER_DELIVERY_S = 0.000_02  # a leaf's insert of each delivery
OVER_APPROXIMATED = 0.15  # a summary lets an event down to nobody who accepts it
SUBTREE_REFUSAL = "no receiver policy below this dispatcher accepts this sender and content"


@dataclass
class Audience:
    """An event's verdicts: for each group its selector selects, None (accepts) or
    the category of its refusal; limited to `recipients` for a resend."""

    verdicts: dict[int, str | None]
    recipients: frozenset[int] | None = None
    # A resend's recipients by (group, leaf): how many of the members are addressed.
    limited: Counter = field(default_factory=Counter)
    count: int = 0  # deliveries it makes

    @classmethod
    def of(cls, verdicts: dict, fleet: Fleet, recipients: list[Receiver] | None = None):
        """The audience, its deliveries counted."""
        audience = cls(verdicts)
        groups = fleet.groups
        if recipients is not None:
            audience.recipients = frozenset(r.id for r in recipients)
            audience.limited = Counter((fleet.group_of[r.id], r.leaf) for r in recipients)
        audience.count = sum(
            audience.reached(groups[g], leaf)
            for g, verdict in verdicts.items() if verdict is None
            for leaf in groups[g].by_leaf
        )  # fmt: skip
        return audience

    def accepts(self, group: int) -> bool:
        return group in self.verdicts and self.verdicts[group] is None

    def reached(self, group: Group, leaf: int) -> int:
        """How many of the group's members at `leaf` the event addresses."""
        if self.recipients is None:
            return len(group.by_leaf.get(leaf, ()))
        return self.limited[(group.index, leaf)]


@dataclass
class Hop:
    """A TrafficRecord to be."""

    dispatcher: int
    direction: str
    forwarded_to: list[int]
    delivered: int
    wasted: int
    at: int


@dataclass
class Route:
    """What routing an event wrote: hops, refusals, and when it reached each leaf."""

    hops: list[Hop] = field(default_factory=list)
    arrivals: dict[int, int] = field(default_factory=dict)
    routed_at: int = 0


class Router:
    """Routes events over one tree and fleet."""

    def __init__(self, tree: Tree, groups: list[Group], rng: random.Random) -> None:
        self.tree = tree
        self.groups = groups
        self.rng = rng
        self._names: dict[tuple[int, int], list[str]] = {}

    def route(self, event, audit: AuditRows) -> Route:
        """The hops of `event` (a plan.Planned), from its sender's leaf up and down."""
        walk = _Walk(self, event, audit)
        moment = event.at
        came_from = None
        for node in self.tree.path_up(event.sender.leaf):
            moment = walk.visit(node, UP, came_from, moment + self.latency())
            came_from = node
        walk.route.routed_at = moment
        return walk.route

    def latency(self) -> int:
        median = HOP_LATENCY_MEDIAN_S * US
        return round(median * math.exp(self.rng.gauss(0, HOP_LATENCY_SIGMA)))

    def names(self, group: Group, leaf: int) -> list[str]:
        """The sorted names of the group's members at the leaf (kept for reuse)."""
        key = (group.index, leaf)
        if key not in self._names:
            self._names[key] = sorted(r.name for r in group.by_leaf.get(leaf, ()))
        return self._names[key]

    def refusing_names(self, audience: Audience, leaves, category=None) -> tuple[list[str], int]:
        """(the first names listed, how many) of the receivers at `leaves` that the
        event addresses and that refuse it (of one category, if given)."""
        lists, total = [], 0
        for index, verdict in audience.verdicts.items():
            if verdict is None or (category is not None and verdict != category):
                continue
            group = self.groups[index]
            for leaf in leaves:
                names = self._reached_names(group, leaf, audience)
                lists.append(names)
                total += len(names)
        return list(islice(heapq.merge(*lists), MAX_LISTED_NAMES)), total

    def _reached_names(self, group: Group, leaf: int, audience: Audience) -> list[str]:
        if audience.recipients is None:
            return self.names(group, leaf)
        members = group.by_leaf.get(leaf, ())
        return sorted(r.name for r in members if r.id in audience.recipients)


class _Walk:
    """One event's way through the tree."""

    def __init__(self, router: Router, event, audit: AuditRows) -> None:
        self.router, self.event, self.audit = router, event, audit
        self.tree = router.tree
        self.route = Route()

    def visit(self, node: int, direction: str, came_from: int | None, moment: int) -> int:
        """Process the event at `node` at `moment`: deliver (a leaf), forward down,
        record the hop; return when the hop was recorded."""
        delivered = self._deliver(node, moment) if self.tree.is_leaf(node) else 0
        children = [c for c in self.tree.children(node) if c != came_from]
        forwarded = [c for c in children if self._lets_down(c)]
        self._audit_refused_subtrees(node, [c for c in children if c not in forwarded], moment)
        done = moment + round(delivered * PER_DELIVERY_S * US) + self.router.latency() // 4
        wasted = int(direction == DOWN and not forwarded and delivered == 0)
        hop = Hop(node, direction, sorted(forwarded), delivered, wasted, done)
        self.route.hops.append(hop)
        for child in forwarded:
            self.visit(child, DOWN, node, done + self.router.latency())
        return done

    def _deliver(self, leaf: int, moment: int) -> int:
        self.route.arrivals[leaf] = moment
        audience = self.event.audience
        delivered = 0
        refused: Counter = Counter()
        for index, verdict in audience.verdicts.items():
            reached = audience.reached(self.router.groups[index], leaf)
            if verdict is None:
                delivered += reached
            elif reached:
                refused[verdict] += reached
        for category, count in sorted(refused.items()):
            self._audit_leaf_refusal(leaf, category, count, moment)
        return delivered

    def _audit_leaf_refusal(self, leaf: int, category: str, count: int, moment: int) -> None:
        """As broker.dispatch.delivery audits a leaf's refusers of one kind."""
        names, total = self.router.refusing_names(self.event.audience, [leaf], category)
        details = {
            "leaf": leaf,
            "category": category,
            "refusers": count,
            "receivers": {"names": names, "unlisted": max(0, total - len(names))},
        }
        plural = "s" if count != 1 else ""
        reason = f"{count} receiver{plural} addressed here " + REFUSAL_REASONS[category]
        self.audit.refusal(moment + MS, self.event.sender_actor, "event.refused_by_policy",
                           self.event.target, reason, details)  # fmt: skip

    def _lets_down(self, child: int) -> bool:
        """Whether the child's summary may match: a receiver below selected and
        accepting (whoever a resend is limited to: summaries do not know), or now
        and then one only selected (summaries over-approximate policies)."""
        selected, accepting = self._below(child)
        return accepting > 0 or (selected > 0 and self.router.rng.random() < OVER_APPROXIMATED)

    def _below(self, node: int) -> tuple[int, int]:
        selected = accepting = 0
        for index, verdict in self.event.audience.verdicts.items():
            by_leaf = self.router.groups[index].by_leaf
            here = sum(len(by_leaf.get(leaf, ())) for leaf in self.tree.below[node])
            selected += here
            accepting += here if verdict is None else 0
        return selected, accepting

    def _audit_refused_subtrees(self, node: int, children: list[int], moment: int) -> None:
        refused = [c for c in children if self._below(c)[0] > 0]
        if not refused:
            return
        by_category = Counter(self._category_below(c) for c in refused)
        for category, subtrees in sorted(by_category.items()):
            details = {"dispatcher": node, "subtrees": subtrees, "category": category}
            self.audit.refusal(moment, self.event.sender_actor, "event.refused_by_policy",
                               self.event.target, SUBTREE_REFUSAL, details)  # fmt: skip

    def _category_below(self, node: int) -> str:
        """As a summary decides it: the union of the policies below admits the sender
        if any of them does (its content then refused), else the sender is refused."""
        for index, verdict in self.event.audience.verdicts.items():
            by_leaf = self.router.groups[index].by_leaf
            if verdict == CONTENT_FILTERED and any(
                leaf in by_leaf for leaf in self.tree.below[node]
            ):
                return CONTENT_FILTERED
        return SENDER_NOT_QUALIFIED
