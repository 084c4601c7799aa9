"""The dispatcher tree's figures, for the console's tree page: per dispatcher its
clients, its summary's size and coagulation loss, its inbox and its last minute of
traffic. Five queries, whatever the size of the tree or of the fleet.

Traffic comes from TrafficRecord, one row per event per dispatcher it passed: `routed`
counts those rows, `forwards` the children they were sent down to, `delivered` the
deliveries made (at leaves), and `wasted` the events that came down into the
dispatcher and went nowhere (its summary let them in; nothing below took them).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta

from django.db.models import Count, F, Func, IntegerField, Sum
from django.db.models.expressions import RawSQL
from django.db.models.fields.json import KeyTransform
from django.utils import timezone

from broker.models import Client, Dispatcher, DispatcherSummary, TrafficRecord

WINDOW = timedelta(minutes=1)
# More than one read's worth of hops waiting (consumer.READ_BATCH): falling behind.
DEEP_INBOX = 500
# Wasted forwards in the window that make a dispatcher worth a look: at least this many,
# and at least this share of the events it routed.
MANY_WASTED = 10
WASTED_SHARE = 0.5


@dataclass(frozen=True)
class Traffic:
    """A dispatcher's hops over the window."""

    routed: int = 0
    forwards: int = 0
    wasted: int = 0
    delivered: int = 0


@dataclass(frozen=True)
class SummaryFigures:
    """A stored summary's size and the loss of its coagulation (DispatcherSummary)."""

    version: int
    receivers: int
    bytes: int  # of its JSON text
    filters: int | None  # None: stored before figures were kept; known after the next
    constraints: int | None
    exact_filters: int | None
    loss_sampled: int
    loss_extra: int

    @property
    def coagulated(self) -> bool:
        """Did coagulation replace the exact filters by fewer, broader ones?"""
        return is_coagulated(self.filters, self.exact_filters)

    @property
    def loss(self) -> float | None:
        """Share of the sampled recent events the summary accepts though no exact filter
        does (coagulation_loss)."""
        return coagulation_loss(
            self.filters, self.exact_filters, self.loss_sampled, self.loss_extra
        )


def is_coagulated(filters: int | None, exact_filters: int | None) -> bool:
    """Did coagulation replace a summary's exact filters by fewer, broader ones?"""
    return None not in (filters, exact_filters) and exact_filters > filters


def coagulation_loss(
    filters: int | None, exact_filters: int | None, loss_sampled: int, loss_extra: int
) -> float | None:
    """Of the recent events sampled when a summary was computed, the share its policy
    accepts though none of the exact filters it replaced does: 0 when nothing was
    coagulated, None when it was but no event was there to measure it on."""
    if not is_coagulated(filters, exact_filters):
        return 0.0
    return loss_extra / loss_sampled if loss_sampled else None


def is_wasteful(wasted: int, routed: int) -> bool:
    """Wasted forwards worth a look: at least MANY_WASTED, and at least WASTED_SHARE of
    the events the dispatcher routed."""
    return wasted >= MANY_WASTED and wasted >= WASTED_SHARE * routed


@dataclass
class DispatcherFigures:
    """One dispatcher, its figures, and its place in the tree."""

    id: int
    name: str
    depth: int
    parent_id: int | None
    is_leaf: bool
    attached: int  # clients attached here (clients attach to leaves)
    summary: SummaryFigures | None  # None: no summary stored yet
    inbox: int
    traffic: Traffic
    clients: int = 0  # in the whole subtree, this dispatcher's own included
    children: list[DispatcherFigures] = field(default_factory=list)

    @property
    def deep_inbox(self) -> bool:
        return self.inbox > DEEP_INBOX

    @property
    def wasteful(self) -> bool:
        return is_wasteful(self.traffic.wasted, self.traffic.routed)

    @property
    def flagged(self) -> bool:
        """Worth an operator's look."""
        return self.deep_inbox or self.wasteful


@dataclass(frozen=True)
class TreeFigures:
    """Every dispatcher, roots first and each followed by its subtree (pre-order)."""

    nodes: list[DispatcherFigures]
    window: timedelta
    measured_at: datetime

    @property
    def roots(self) -> list[DispatcherFigures]:
        return [node for node in self.nodes if node.parent_id is None]

    @property
    def clients(self) -> int:
        return sum(root.clients for root in self.roots)

    @property
    def inbox(self) -> int:
        return sum(node.inbox for node in self.nodes)

    @property
    def traffic(self) -> Traffic:
        """The whole tree's hops over the window."""
        names = [f.name for f in fields(Traffic)]
        totals = {name: sum(getattr(n.traffic, name) for n in self.nodes) for name in names}
        return Traffic(**totals)

    @property
    def flagged(self) -> int:
        return sum(node.flagged for node in self.nodes)


def tree_figures(*, inboxes: Mapping[int, int], window: timedelta = WINDOW) -> TreeFigures:
    """The tree's figures now, over the last `window` of traffic, with `inboxes`
    ({dispatcher id: hops waiting}, broker.dispatch.transport.inbox_depths)."""
    now = timezone.now()
    attached = clients_by_dispatcher()
    summaries = summary_figures()
    traffic = traffic_since(now - window)
    rows = Dispatcher.objects.values_list("id", "name", "depth", "parent_id", "is_leaf")
    nodes = {
        row[0]: DispatcherFigures(
            *row,
            attached=attached.get(row[0], 0),
            summary=summaries.get(row[0]),
            inbox=inboxes.get(row[0], 0),
            traffic=traffic.get(row[0], Traffic()),
        )
        for row in rows
    }
    return TreeFigures(_pre_order(nodes), window, now)


def _pre_order(nodes: dict[int, DispatcherFigures]) -> list[DispatcherFigures]:
    """Link children to parents, total clients per subtree, and list the nodes roots
    first, each followed by its subtree (children in id order)."""
    for node in sorted(nodes.values(), key=lambda n: n.id):
        if node.parent_id in nodes:
            nodes[node.parent_id].children.append(node)
    ordered: list[DispatcherFigures] = []
    stack = sorted((n for n in nodes.values() if n.parent_id not in nodes), key=lambda n: -n.id)
    while stack:
        node = stack.pop()
        ordered.append(node)
        stack.extend(reversed(node.children))
    for node in reversed(ordered):  # children before their parents
        node.clients = node.attached + sum(child.clients for child in node.children)
    return ordered


def clients_by_dispatcher() -> dict[int, int]:
    """{dispatcher id: clients attached to it}."""
    rows = (
        Client.objects.filter(dispatcher__isnull=False)
        .values("dispatcher_id")
        .annotate(count=Count("id"))
        .order_by()
    )
    return {row["dispatcher_id"]: row["count"] for row in rows}


def summary_figures() -> dict[int, SummaryFigures]:
    """{dispatcher id: its stored summary's figures}, without reading the summaries."""
    rows = DispatcherSummary.objects.annotate(
        receivers=KeyTransform("receivers", "data"),
        bytes=RawSQL("octet_length(data::text)", [], output_field=IntegerField()),
    ).values_list(
        "dispatcher_id", "version", "receivers", "bytes", "filters", "constraints",
        "exact_filters", "loss_sampled", "loss_extra",
    )  # fmt: skip
    return {row[0]: SummaryFigures(*row[1:]) for row in rows}


def traffic_since(since: datetime) -> dict[int, Traffic]:
    """{dispatcher id: its hops since `since`} (an indexed range of TrafficRecord.at)."""
    forwards = Func(F("forwarded_to"), function="jsonb_array_length", output_field=IntegerField())
    rows = (
        TrafficRecord.objects.filter(at__gte=since)
        .values("dispatcher_id")
        .annotate(
            routed=Count("id"),
            forwards=Sum(forwards),
            wasted=Sum("wasted"),
            delivered=Sum("delivered"),
        )
        .order_by()
    )
    return {row.pop("dispatcher_id"): Traffic(**row) for row in rows}
