"""The tree efficiency report on the worm incident, checked against figures computed
here from the database (ORM rows and SQL, plain Python), never from Spark."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from broker.models import Dispatcher, Event, TrafficRecord
from broker.reads.clients import current_attributes
from reports.jobs import tree as tree_report
from reports.results import Params
from tests.reports.expected import percentile
from tests.reports.incident import READING_MARKS

pytestmark = READING_MARKS


# What the database says ---------------------------------------------------------------


def hops_in(params: Params, region: str = "") -> list[TrafficRecord]:
    hops = TrafficRecord.objects.filter(at__gte=params.window_start, at__lt=params.window_end)
    if region:
        senders = [e.pk for e in Event.objects.select_related("sender")
                   if current_attributes(e.sender).get("region") == region]  # fmt: skip
        hops = hops.filter(event_id__in=senders)
    return list(hops)


def parents() -> dict[int, int | None]:
    return dict(Dispatcher.objects.values_list("id", "parent_id"))


def latency_ms(hop: TrafficRecord, others: list[TrafficRecord], parent: dict) -> float | None:
    """The report's definition: from the parent's hop (down), from a child's hop up."""
    here = hop.dispatcher_id
    if hop.direction == "down":
        before = [o.at for o in others if o.dispatcher_id == parent[here]]
    else:
        before = [o.at for o in others if o.direction == "up" and parent[o.dispatcher_id] == here]
    before = [at for at in before if at <= hop.at]
    return (hop.at - max(before)) / timedelta(milliseconds=1) if before else None


def figures(hops: list[tuple[TrafficRecord, float | None]]) -> dict:
    latencies = [ms for _, ms in hops if ms is not None]
    return {
        "routed": len(hops),
        "forwards": sum(len(h.forwarded_to) for h, _ in hops),
        "wasted": sum(h.wasted for h, _ in hops),
        "deliveries": sum(h.delivered for h, _ in hops),
        "entered": sum(h.direction == "up" and ms is None for h, ms in hops),
        "latency_hops": len(latencies),
        "latency_p50_ms": percentile(latencies, 0.5) if latencies else None,
        "latency_p95_ms": percentile(latencies, 0.95) if latencies else None,
    }


def expected_traffic(params: Params, region: str = "") -> tuple[dict, dict, dict]:
    """(per dispatcher name, per depth, overall) figures of the window's hops."""
    hops = hops_in(params, region)
    parent = parents()
    by_event = defaultdict(list)
    for hop in hops:
        by_event[hop.event_id].append(hop)
    measured = [(hop, latency_ms(hop, by_event[hop.event_id], parent)) for hop in hops]
    dispatchers = {d.pk: d for d in Dispatcher.objects.all()}
    per_dispatcher, per_depth = defaultdict(list), defaultdict(list)
    for hop, ms in measured:
        per_dispatcher[dispatchers[hop.dispatcher_id].name].append((hop, ms))
        per_depth[dispatchers[hop.dispatcher_id].depth].append((hop, ms))
    return (
        {name: figures(rows) for name, rows in per_dispatcher.items()},
        {depth: figures(rows) for depth, rows in per_depth.items()},
        figures(measured),
    )


def expected_summaries() -> dict[str, dict]:
    """Each dispatcher's stored summary: its size, and its coagulation loss."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT d.name, s.filters, s.constraints, s.exact_filters,"
            " octet_length(s.data::text), s.loss_sampled, s.loss_extra"
            " FROM broker_dispatcher d JOIN broker_dispatchersummary s ON s.dispatcher_id = d.id"
        )
        found = {}
        for name, filters, constraints, exact, size, sampled, extra in cursor.fetchall():
            coagulated = exact is not None and filters is not None and exact > filters
            loss = (extra / sampled if sampled else None) if coagulated else 0.0
            found[name] = {
                "filters": filters, "constraints": constraints, "exact_filters": exact,
                "summary_bytes": size, "loss_sampled": sampled, "loss_extra": extra,
                "loss": loss,
            }  # fmt: skip
    return found


TRAFFIC = ("routed", "forwards", "wasted", "deliveries", "entered", "latency_hops")
PERCENTILES = ("latency_p50_ms", "latency_p95_ms")


def assert_same_traffic(row: dict, expected: dict) -> None:
    assert {f: row[f] for f in TRAFFIC} == {f: expected[f] for f in TRAFFIC}
    for name in PERCENTILES:
        assert row[name] == pytest.approx(expected[name])


def blank() -> dict:
    return figures([])


# The report ---------------------------------------------------------------------------


def test_each_dispatcher_s_routing_deliveries_and_hop_latency_are_its_hops(incident):
    params = incident.params
    result = tree_report.run(incident.data, params)
    per_dispatcher, _, overall = expected_traffic(params)
    rows = {row["dispatcher"]: row for row in result.sections["dispatchers"]}
    assert set(rows) == set(Dispatcher.objects.values_list("name", flat=True))
    for name, row in rows.items():
        assert_same_traffic(row, per_dispatcher.get(name, blank()))
        routed, wasted = row["routed"], row["wasted"]
        assert row["wasted_share"] == (pytest.approx(wasted / routed) if routed else None)
    assert overall["latency_hops"] > 0 and overall["deliveries"] > 0
    # The summary says `events` for the events that entered the tree.
    assert_same_traffic({**result.summary, "entered": result.summary["events"]}, overall)
    assert result.summary["events"] == Event.objects.count()


def test_summary_sizes_and_coagulation_loss_are_the_stored_summaries(incident):
    result = tree_report.run(incident.data, incident.params)
    summaries = expected_summaries()
    assert summaries
    for row in result.sections["dispatchers"]:
        expected = summaries[row["dispatcher"]]
        assert {name: row[name] for name in expected} == pytest.approx(expected)


def test_a_level_aggregates_its_dispatchers_hops(incident):
    params = incident.params
    result = tree_report.run(incident.data, params)
    _, per_depth, _ = expected_traffic(params)
    depths = Dispatcher.objects.values_list("depth", flat=True)
    levels = {row["depth"]: row for row in result.sections["levels"]}
    assert set(levels) == set(depths)
    for depth, row in levels.items():
        assert row["dispatchers"] == list(depths).count(depth)
        assert_same_traffic(row, per_depth.get(depth, blank()))
        sizes = [s for name, s in expected_summaries().items()
                 if Dispatcher.objects.get(name=name).depth == depth]  # fmt: skip
        assert row["summary_bytes"] == sum(s["summary_bytes"] for s in sizes)


def test_a_region_keeps_the_hops_of_the_events_its_clients_sent(incident):
    params = replace(incident.params, region="Northwest")
    result = tree_report.run(incident.data, params)
    per_dispatcher, _, overall = expected_traffic(params, region="Northwest")
    for row in result.sections["dispatchers"]:
        assert_same_traffic(row, per_dispatcher.get(row["dispatcher"], blank()))
    everything = expected_traffic(incident.params)[2]
    assert 0 < overall["routed"] < everything["routed"]
    assert result.summary["routed"] == overall["routed"]


def test_an_empty_window_lists_the_dispatchers_without_traffic(incident):
    long_ago = datetime(2000, 1, 1, tzinfo=UTC)
    result = tree_report.run(incident.data, Params(long_ago, long_ago + timedelta(hours=1)))
    assert len(result.sections["dispatchers"]) == Dispatcher.objects.count()
    for row in result.sections["dispatchers"] + result.sections["levels"]:
        assert_same_traffic(row, blank())
    assert result.summary["routed"] == result.summary["events"] == 0


def test_a_hop_whose_hop_before_lies_before_the_window_is_not_measured(incident):
    # The window starts at a hop up whose hop before (a child's, up) is earlier: in the
    # window, that hop is not measured and counts as its event's entry into the tree.
    parent = parents()
    ups = TrafficRecord.objects.filter(direction="up").order_by("at")
    cut = next(
        hop for hop in ups
        if any(o.at < hop.at and parent[o.dispatcher_id] == hop.dispatcher_id for o in ups)
    )  # fmt: skip
    params = replace(incident.params, window_start=cut.at)
    result = tree_report.run(incident.data, params)
    per_dispatcher, _, overall = expected_traffic(params)
    for row in result.sections["dispatchers"]:
        assert_same_traffic(row, per_dispatcher.get(row["dispatcher"], blank()))
    name = Dispatcher.objects.get(pk=cut.dispatcher_id).name
    assert expected_traffic(incident.params)[0][name]["entered"] == 0  # over the whole window
    assert per_dispatcher[name]["entered"] >= 1
    assert result.summary["events"] == overall["entered"]
