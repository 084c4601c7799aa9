"""The latency report against the database: percentiles worked out in Python, hop
counts from the Dispatcher rows."""

from __future__ import annotations

from datetime import UTC, datetime

from reports.jobs import latency
from reports.results import Params
from tests.reports import expected
from tests.reports.incident import READING_MARKS

pytestmark = READING_MARKS

PERCENTILES = {"p50": 0.5, "p95": 0.95, "p99": 0.99}


def figures(rows: list) -> dict:
    """Counts and percentiles (seconds) of both delays of these deliveries."""
    delays = {
        "delivery": [expected.micros(d.delivered_at - d.event.published_at) for d in rows],
        "ack": [expected.micros(d.acked_at - d.event.published_at) for d in rows if d.acked_at],
    }
    result = {}
    for measure, values in delays.items():
        result[f"{measure}_count"] = len(values)
        for name, fraction in PERCENTILES.items():
            value = expected.percentile(values, fraction) / 1e6 if values else None
            result[f"{measure}_{name}_s"] = value
    return result


def expected_sections(params: Params) -> dict:
    rows = expected.deliveries(params)
    region_of = expected.regions()
    hops = expected.by(rows, lambda d: expected.hop_count(d.event.sender, d.receiver))
    regions = expected.by(rows, lambda d: region_of[d.receiver_id])
    return {
        "by_hops": [{"hops": n, **figures(hops[n])} for n in sorted(hops)],
        "by_region": [{"region": r, **figures(regions[r])} for r in sorted(regions)],
        "overall": [figures(rows)] if rows else [],
    }


def test_percentiles_per_hop_count_and_region_match_the_database(incident):
    result = latency.run(incident.data, incident.params)

    assert result.sections == expected_sections(incident.params)
    # The default tree (3 levels, 2 children each): same leaf, sibling leaves, cousins.
    assert [row["hops"] for row in result.sections["by_hops"]] == [1, 3, 5]
    assert result.summary["deliveries"] == 59


def test_a_regions_latency_covers_only_its_receivers(incident):
    window = incident.params
    params = Params(window.window_start, window.window_end, "Northwest")

    result = latency.run(incident.data, params)

    assert result.sections == expected_sections(params)
    assert [row["region"] for row in result.sections["by_region"]] == ["Northwest"]


def test_a_window_without_deliveries_gives_empty_sections(incident):
    params = Params(datetime(2001, 1, 1, tzinfo=UTC), datetime(2001, 1, 2, tzinfo=UTC))

    result = latency.run(incident.data, params)

    assert result.sections == {"by_hops": [], "by_region": [], "overall": []}
    assert result.summary["deliveries"] == 0
