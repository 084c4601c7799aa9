"""Exact percentiles by binned counts agree with sorting every value, whatever the
spread, the ties, the signs and the group sizes."""

from __future__ import annotations

import itertools
import random
from datetime import UTC, datetime

import pytest
from pyspark.sql import functions as F

from reports.jobs import percentiles as percentiles_module
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


@pytest.mark.parametrize("fetched", [percentiles_module.FETCHED_VALUES, 0], ids=["driver", "spark"])
def test_binned_percentiles_equal_those_of_the_sorted_values_per_group_and_overall(
    spark, monkeypatch, fetched
):
    # The values of the bins wanted are sorted on the driver, or (more than
    # FETCHED_VALUES of them) by Spark.
    monkeypatch.setattr(percentiles_module, "FETCHED_VALUES", fetched)
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


JOB_GROUPS = itertools.count()


def jobs_of(spark, compute) -> tuple[object, int]:
    """What `compute()` returns, and how many Spark jobs it ran."""
    context, group = spark.sparkContext, f"counted-{next(JOB_GROUPS)}"
    context.setJobGroup(group, "test")
    try:
        found = compute()
    finally:
        context.setJobGroup("", "")
    return found, len(context.statusTracker().getJobIdsForGroup(group))


def test_groups_whose_wanted_bins_hold_two_values_at_most_take_one_query(spark):
    # Values far apart: each in a bin of its own, or two in one (5 and 5), so that the
    # first query's least and greatest of each bin are every value there.
    rows = [("sparse", "a", value) for value in (5, 5, 300, 9_000, 250_000, 7_000_000)]
    values = small_frame(spark, rows, "shape string, series string, value long")
    found, jobs = jobs_of(spark, lambda: percentiles(values, {"shape": "shape"}, FRACTIONS))
    group = [value for _, _, value in rows]
    assert [found[0][name] for name in FRACTIONS] == [
        percentile(group, fraction) for fraction in FRACTIONS.values()
    ]
    assert jobs == 1


def test_bins_holding_a_few_values_bring_them_in_the_first_query_when_asked(spark):
    # Ties and near values: bins of up to 40 values, across two finest groups.
    draw = random.Random(5)
    rows = [(f"g{i % 2}", "a", draw.choice([1000, 1001, 1002, 5000])) for i in range(80)]
    values = small_frame(spark, rows, "shape string, series string, value long")
    groupings = {"shape": "shape", "all": None}

    found, jobs = jobs_of(
        spark, lambda: percentiles(values, groupings, FRACTIONS, values_per_bin=40)
    )
    again, more_jobs = jobs_of(spark, lambda: percentiles(values, groupings, FRACTIONS))

    assert found == again
    overall = next(row for row in found if row["grouping"] == "all")
    group = [value for _, _, value in rows]
    assert [overall[name] for name in FRACTIONS] == [
        percentile(group, fraction) for fraction in FRACTIONS.values()
    ]
    assert (jobs, more_jobs) == (1, 2)


def test_sums_are_added_up_per_group_over_every_row_in_the_same_query(spark):
    rows = [("a", 10, 1), ("a", None, 2), ("b", None, 4), ("a", 30, 8)]
    values = small_frame(spark, rows, "shape string, value long, weight long").withColumn(
        "series", F.lit("s")
    )
    found, jobs = jobs_of(
        spark,
        lambda: percentiles(values, {"shape": "shape", "all": None}, FRACTIONS, sums=("weight",)),
    )
    by_group = {(row["grouping"], row["key"]): row for row in found}
    assert {group: row["weight"] for group, row in by_group.items()} == {
        ("shape", "a"): 11, ("shape", "b"): 4, ("all", ""): 15,
    }  # fmt: skip
    assert by_group[("shape", "b")]["count"] == 0 and by_group[("shape", "b")]["p50"] is None
    assert by_group[("all", "")]["count"] == 2 and by_group[("all", "")]["p50"] == 20
    assert jobs == 1


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
