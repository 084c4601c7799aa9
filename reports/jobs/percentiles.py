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

BINS_PER_DOUBLING = 128
GROUP = ["grouping", "key", "series"]


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
    are left out; rows with a null in a grouping's column are a group of their own
    there (key None)."""
    binned = values.where(F.col("value").isNotNull()).withColumn("bin", _bin(F.col("value")))
    histograms = _histograms(binned, groupings)
    wanted = {group: _ranks(h.total, fractions) for group, h in histograms.items()}
    found = _values_at(binned, groupings, histograms, wanted)
    return [
        _interpolated(group, histograms[group].total, wanted[group], found, fractions)
        for group in sorted(histograms, key=_in_order)
    ]


def _in_order(group: tuple) -> tuple:
    # A group whose key is null (a row without a value of the column grouped by) first.
    return tuple((part is not None, part or "") for part in group)


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
    """(group, bin, offset) -> the value there, for each of `places`. Only values in a
    bin some group wants are spread over the groupings, and only a group's wanted bins
    sorted. (Places are picked by filters on sets of values, not joins with frames of
    them: each join with a frame, however small, would cost a Spark job to broadcast it.)"""
    bins = {(*group, bin_) for group, bin_, _ in places}
    in_order = Window.partitionBy(*GROUP, "bin").orderBy("value")
    candidates = binned.where(F.col("bin").isin(sorted({place[-1] for place in bins})))
    found = (
        _in_groups(candidates, groupings, "bin", "value")
        .where(_place(*GROUP, "bin").isin(sorted(_place_text(bin_) for bin_ in bins)))
        .withColumn("offset", F.row_number().over(in_order) - 1)
        .where(_place(*GROUP, "bin", "offset").isin(sorted(_place_text(p) for p in _flat(places))))
        .collect()
    )
    return {
        ((row["grouping"], row["key"], row["series"]), row["bin"], row["offset"]): row["value"]
        for row in found
    }


# A place (a group, a bin, an offset) as one text, the same in Spark as in Python.
PLACE_SEPARATOR, NULL_TEXT = "\x1f", "\x00null"


def _place(*columns: str) -> Column:
    texts = [F.coalesce(F.col(c).cast("string"), F.lit(NULL_TEXT)) for c in columns]
    return F.concat_ws(PLACE_SEPARATOR, *texts)


def _place_text(values: tuple) -> str:
    return PLACE_SEPARATOR.join(NULL_TEXT if v is None else str(v) for v in values)


def _flat(places: set[tuple]) -> list[tuple]:
    return [(*group, bin_, offset) for group, bin_, offset in places]


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
