"""Exact percentiles by binned counts agree with sorting every value, whatever the
spread, the ties, the signs and the group sizes."""

from __future__ import annotations

import random
from datetime import UTC, datetime

from reports.jobs.percentiles import percentiles
from reports.spark import small_frame
from tests.reports.expected import percentile

FRACTIONS = {"p0": 0.0, "p50": 0.5, "p95": 0.95, "p99": 0.99, "p100": 1.0}


def drawn_values() -> list[tuple[str, str, int]]:
    """(shape, series, value): spreads from microseconds to hours, many ties, some
    negative values (clocks), a group of one and one of two."""
    draw = random.Random(3)
    rows = [("wide", "a", int(draw.lognormvariate(12, 3))) for _ in range(3000)]
    rows += [("ties", "a", draw.choice([5, 5, 5, 70, 70, 1_000_000])) for _ in range(500)]
    rows += [("signed", "a", draw.randint(-50_000, 50_000)) for _ in range(700)]
    rows += [("one", "a", 42), ("two", "a", 7), ("two", "a", 8)]
    rows += [("wide", "b", draw.randint(0, 10**9)) for _ in range(800)]
    # Groups named with what a region's name may hold: a null, separators, other scripts.
    rows += [(None, "a", draw.randint(0, 900)) for _ in range(40)]
    rows += [('ré\x1fgion, "eu"', "a", draw.randint(0, 900)) for _ in range(40)]
    return rows


def test_binned_percentiles_equal_those_of_the_sorted_values_per_group_and_overall(spark):
    rows = drawn_values()
    values = spark.createDataFrame(rows, "shape string, series string, value long")

    found = percentiles(values, {"shape": "shape", "all": None}, FRACTIONS)

    groups: dict[tuple, list[int]] = {}
    for shape, series, value in rows:
        groups.setdefault(("shape", shape, series), []).append(value)
        groups.setdefault(("all", "", series), []).append(value)
    assert {(r["grouping"], r["key"], r["series"]) for r in found} == set(groups)
    for row in found:
        group = groups[(row["grouping"], row["key"], row["series"])]
        assert row["count"] == len(group)
        for name, fraction in FRACTIONS.items():
            assert row[name] == percentile(group, fraction), (row["key"], name)


def test_a_small_frame_holds_its_rows_and_types_in_the_plan_itself(spark):
    rows = [(1, "café ☕", datetime(2026, 11, 28, 9, 30, tzinfo=UTC)), (2, None, None)]
    frame = small_frame(spark, rows, "id long, name string, at timestamp")
    empty = small_frame(spark, [], "id long, name string, at timestamp")

    assert [tuple(row) for row in frame.orderBy("id").collect()] == [
        (1, "café ☕", datetime(2026, 11, 28, 9, 30)),  # the session's zone is UTC
        (2, None, None),
    ]
    assert frame.schema == empty.schema and empty.count() == 0
    # A local relation: no RDD of pickles for Python workers to read at each query.
    assert frame._jdf.queryExecution().analyzed().getClass().getSimpleName() == "LocalRelation"
