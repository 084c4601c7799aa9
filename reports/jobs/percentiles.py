"""Exact percentiles of large groups, by aggregation rather than by sorting every value
of a group (Spark's own `percentile` keeps each group's distinct values in a hash map,
and took minutes over ten million deliveries).

One pass counts the values in bins that widen with the value (1/BINS_PER_DOUBLING of a
doubling wide: a few thousand bins per group, whatever the spread), per finest group;
coarser groupings add those counts up, without reading the values again. Running
totals over the counts say which bin holds each rank wanted; a second pass sorts only
the values of those bins. A percentile interpolates between the two nearest ranks, as
Spark's `percentile` and numpy's default ("linear") do: at position p * (n - 1) of the
sorted values, low + (position - floor(position)) * (high - low).
"""

from __future__ import annotations

from functools import reduce

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

BINS_PER_DOUBLING = 128
GROUP = ["grouping", "key", "series"]


def percentiles(
    values: DataFrame, groupings: dict[str, str | None], fractions: dict[str, float]
) -> DataFrame:
    """Percentiles of `value` per `series` (a column of `values`) and per group of each
    grouping: name -> the column whose values are its groups (as text), or None for
    one group of everything (key ""). Returns grouping, key, series, `count` (of
    non-null values) and one column per name of `fractions`. Groups without values
    are left out."""
    binned = values.where(F.col("value").isNotNull()).withColumn("bin", _bin(F.col("value")))
    columns = [column for column in groupings.values() if column]
    finest = binned.groupBy(*columns, "series", "bin").agg(F.count(F.lit(1)).alias("n"))
    counts = reduce(
        DataFrame.unionByName,
        (_regrouped(finest, name, column) for name, column in groupings.items()),
    )
    targets = _ranks_wanted(_spans(counts), fractions)
    in_order = Window.partitionBy(*GROUP, "bin", "name", "end").orderBy("value")
    found = (
        _in_groups(binned, groupings)
        .join(F.broadcast(targets), [*GROUP, "bin"])
        .withColumn("offset", F.row_number().over(in_order) - 1)
        .where(F.col("offset") == F.col("rank") - F.col("start"))
    )
    return _interpolated(found, fractions)


def _bin(value: Column) -> Column:
    """A bin number that never decreases as the value grows (negatives included)."""
    magnitude = F.floor(F.log2(F.abs(value) + F.lit(1)) * F.lit(BINS_PER_DOUBLING))
    return F.when(value < 0, -magnitude).otherwise(magnitude)


def _key(column: str | None) -> Column:
    return F.col(column).cast("string") if column else F.lit("")


def _regrouped(finest: DataFrame, name: str, column: str | None) -> DataFrame:
    """The finest counts added up into the grouping's groups."""
    return finest.groupBy(
        F.lit(name).alias("grouping"), _key(column).alias("key"), "series", "bin"
    ).agg(F.sum("n").alias("n"))


def _in_groups(binned: DataFrame, groupings: dict[str, str | None]) -> DataFrame:
    """Each value once per grouping, with its group there (one small bin of them is
    all that is kept of each after the join with the bins wanted)."""
    per_grouping = F.explode(
        F.array(
            *(
                F.struct(F.lit(name).alias("grouping"), _key(column).alias("key"))
                for name, column in groupings.items()
            )
        )
    )
    return binned.select("series", "bin", "value", per_grouping.alias("g")).select(
        "g.grouping", "g.key", "series", "bin", "value"
    )


def _spans(counts: DataFrame) -> DataFrame:
    """Per group and bin: the ranks it holds, [start, start + n), and the group's count."""
    group = Window.partitionBy(*GROUP)
    so_far = group.orderBy("bin").rowsBetween(Window.unboundedPreceding, 0)
    return counts.select(
        *GROUP,
        "bin",
        (F.sum("n").over(so_far) - F.col("n")).alias("start"),
        F.col("n"),
        F.sum("n").over(group).alias("count"),
    )


def _ranks_wanted(spans: DataFrame, fractions: dict[str, float]) -> DataFrame:
    """The bins holding the two ranks around each percentile's position, with the
    rank (0 for the smallest) each must give; `end` says which of the two it is."""
    wanted = spans.sparkSession.createDataFrame(
        list(fractions.items()), "name string, fraction double"
    )
    position = F.col("fraction") * (F.col("count") - 1)
    ends = F.array(
        F.struct(F.lit("low").alias("end"), F.floor(position).alias("rank")),
        F.struct(F.lit("high").alias("end"), F.ceil(position).alias("rank")),
    )
    spots = spans.crossJoin(F.broadcast(wanted)).select(
        *GROUP, "bin", "start", "n", "count", "name", position.alias("position"),
        F.explode(ends).alias("spot"),
    )  # fmt: skip
    rank = F.col("spot.rank")
    inside = (rank >= F.col("start")) & (rank < F.col("start") + F.col("n"))
    return spots.where(inside).select(
        *GROUP, "bin", "start", "count", "name", "position",
        F.col("spot.end").alias("end"), rank.alias("rank"),
    )  # fmt: skip


def _interpolated(found: DataFrame, fractions: dict[str, float]) -> DataFrame:
    ends = found.groupBy(*GROUP, "count", "name", "position").agg(
        F.min("value").alias("low_value"), F.max("value").alias("high_value")
    )
    between = F.col("position") - F.floor("position")
    value = F.col("low_value") + between * (F.col("high_value") - F.col("low_value"))
    return ends.groupBy(*GROUP, "count").agg(
        *(F.max(F.when(F.col("name") == name, value)).alias(name) for name in fractions)
    )
