"""Exact percentiles of large groups, by aggregation rather than by sorting every value
of a group (Spark's own `percentile` keeps each group's distinct values in a hash map,
and took minutes over ten million deliveries), in two Spark queries.

The first counts the values in bins that widen with the value (1/BINS_PER_DOUBLING of
a doubling wide: a few thousand bins per group, whatever the spread), per group of
every grouping, and brings each group's counts to the driver (a few thousand numbers
per group, not its values). There, running totals say which bin holds each rank wanted
and where in the bin it is. The second query sorts only the values of those bins and
brings back only the values at those ranks. A percentile interpolates between the two
nearest ranks, as Spark's `percentile` and numpy's default ("linear") do: at position
p * (n - 1) of the sorted values, low + (position - floor(position)) * (high - low).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass, field
from itertools import accumulate

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from reports.spark import small_frame

BINS_PER_DOUBLING = 128
GROUP = ["grouping", "key", "series"]
BINS_SCHEMA = "grouping string, key string, series string, bin long"


@dataclass
class Histogram:
    """One group's counts per bin, the bins in ascending order."""

    bins: list[int]
    counts: list[int]
    ends: list[int] = field(init=False)  # running totals: the ranks each bin ends at

    def __post_init__(self) -> None:
        self.ends = list(accumulate(self.counts))

    @property
    def total(self) -> int:
        return self.ends[-1] if self.ends else 0

    def locate(self, rank: int) -> tuple[int, int]:
        """The bin holding the `rank`-th smallest value (0 first), and its offset there."""
        index = bisect_right(self.ends, rank)
        before = self.ends[index - 1] if index else 0
        return self.bins[index], rank - before


def percentiles(
    values: DataFrame, groupings: dict[str, str | None], fractions: dict[str, float]
) -> list[dict]:
    """Percentiles of `value` per `series` (a column of `values`) and per group of each
    grouping: name -> the column whose values are its groups (as text), or None for
    one group of everything (key ""). Returns dicts of grouping, key, series, `count`
    (of non-null values) and one value per name of `fractions`. Groups without values
    are left out."""
    binned = values.where(F.col("value").isNotNull()).withColumn("bin", _bin(F.col("value")))
    histograms = _histograms(binned, groupings)
    wanted = {group: _ranks(h.total, fractions) for group, h in histograms.items()}
    found = _values_at(binned, groupings, histograms, wanted)
    return [
        _interpolated(group, histograms[group].total, wanted[group], found, fractions)
        for group in sorted(histograms)
    ]


def _bin(value: Column) -> Column:
    """A bin number that never decreases as the value grows (negatives included)."""
    magnitude = F.floor(F.log2(F.abs(value) + F.lit(1)) * F.lit(BINS_PER_DOUBLING))
    return F.when(value < 0, -magnitude).otherwise(magnitude)


def _key(column: str | None) -> Column:
    return F.col(column).cast("string") if column else F.lit("")


def _in_groups(frame: DataFrame, groupings: dict[str, str | None], *columns: str) -> DataFrame:
    """Each row of `frame` once per grouping, with its group there: grouping, key,
    series and `columns`."""
    per_grouping = F.explode(
        F.array(
            *(
                F.struct(F.lit(name).alias("grouping"), _key(column).alias("key"))
                for name, column in groupings.items()
            )
        )
    )
    return frame.select("series", *columns, per_grouping.alias("g")).select(
        "g.grouping", "g.key", "series", *columns
    )


def _histograms(binned: DataFrame, groupings: dict[str, str | None]) -> dict[tuple, Histogram]:
    """The first query: per group, its counts per bin. The values are counted per
    finest group and bin first; the groupings add those counts up."""
    finest = [column for column in groupings.values() if column]
    counted = binned.groupBy(*finest, "series", "bin").agg(F.count(F.lit(1)).alias("n"))
    regrouped = _in_groups(counted, groupings, "bin", "n").groupBy(*GROUP, "bin").sum("n")
    per_group = regrouped.groupBy(*GROUP).agg(
        F.sort_array(F.collect_list(F.struct("bin", F.col("sum(n)").alias("n")))).alias("bins")
    )
    return {
        (row["grouping"], row["key"], row["series"]): Histogram(
            [b["bin"] for b in row["bins"]], [b["n"] for b in row["bins"]]
        )
        for row in per_group.collect()
    }


def _ranks(count: int, fractions: dict[str, float]) -> dict[str, tuple[float, int, int]]:
    """Per fraction: its position among `count` sorted values, and the ranks around it."""
    ranks = {}
    for name, fraction in fractions.items():
        position = fraction * (count - 1)
        ranks[name] = (position, math.floor(position), math.ceil(position))
    return ranks


def _values_at(
    binned: DataFrame, groupings: dict, histograms: dict, wanted: dict
) -> dict[tuple, float]:
    """The second query: (group, rank) -> the value of that rank, for every rank wanted."""
    places = {
        (group, rank): (group, *histograms[group].locate(rank))
        for group, ranks in wanted.items()
        for _, low, high in ranks.values()
        for rank in (low, high)
    }
    if not places:
        return {}
    found = _picked(binned, groupings, set(places.values()))
    return {group_rank: found[place] for group_rank, place in places.items()}


def _picked(binned: DataFrame, groupings: dict, places: set[tuple]) -> dict:
    """(group, bin, offset) -> the value there, for each of `places`. Only values whose
    series and bin some group wants are spread over the groupings and sorted."""
    series_bins, bins, wanted = _wanted(binned.sparkSession, places)
    in_order = Window.partitionBy(*GROUP, "bin").orderBy("value")
    candidates = binned.join(F.broadcast(series_bins), ["series", "bin"], "left_semi")
    found = (
        _in_groups(candidates, groupings, "bin", "value")
        .join(F.broadcast(bins), [*GROUP, "bin"], "left_semi")
        .withColumn("offset", F.row_number().over(in_order) - 1)
        .join(F.broadcast(wanted), [*GROUP, "bin", "offset"])
        .collect()
    )
    return {
        ((row["grouping"], row["key"], row["series"]), row["bin"], row["offset"]): row["value"]
        for row in found
    }


def _wanted(spark, places: set[tuple]) -> tuple[DataFrame, DataFrame, DataFrame]:
    """The series' bins, the groups' bins and the places wanted, as frames made on the
    driver (a distinct of one frame in Spark would cost a job for each)."""
    wanted = sorted((*group, bin_, offset) for group, bin_, offset in places)
    bins = sorted({place[:4] for place in wanted})
    series_bins = sorted({(series, bin_) for _, _, series, bin_ in bins})
    return (
        small_frame(spark, series_bins, "series string, bin long"),
        small_frame(spark, bins, BINS_SCHEMA),
        small_frame(spark, wanted, f"{BINS_SCHEMA}, offset int"),
    )


def _interpolated(
    group: tuple, count: int, ranks: dict, found: dict, fractions: dict[str, float]
) -> dict:
    grouping, key, series = group
    row = {"grouping": grouping, "key": key, "series": series, "count": count}
    for name in fractions:
        position, low, high = ranks[name]
        low_value, high_value = found[(group, low)], found[(group, high)]
        row[name] = low_value + (position - math.floor(position)) * (high_value - low_value)
    return row
