"""Exact percentiles of large groups, by aggregation rather than by sorting every value
of a group (Spark's own `percentile` keeps each group's distinct values in a hash map,
and took minutes over ten million deliveries), in two Spark queries.

The first counts the values in bins that widen with the value (1/BINS_PER_DOUBLING of
a doubling wide: a few thousand bins per group, whatever the spread), per group of
every grouping, and brings each group's counts to the driver (a few thousand numbers
per group, not its values). There, running totals say which bin holds each rank wanted
and where in the bin it is. The second query sorts only the values of those bins and
brings back only the values at those ranks; it is not run when every bin wanted holds
at most two values, which the first query's least and greatest value of each bin then
are (the sparse groups of a small dataset: the tree's hops). A percentile
interpolates between the two nearest ranks, as Spark's `percentile` and numpy's
default ("linear") do: at position p * (n - 1) of the sorted values,
low + (position - floor(position)) * (high - low).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass, field
from itertools import accumulate

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from reports.jobs.frames import sql_text

BINS_PER_DOUBLING = 128
# Up to this many values in the bins holding the ranks wanted come to the driver, to be
# sorted there (tens of MB at most); more are sorted by Spark, and only the values at
# the ranks wanted come. (Over 1,000,000 deliveries the latency report brings about
# 115,000: a filter and a read of Arrow, against a shuffle, a sort and rows.)
FETCHED_VALUES = 1_000_000
GROUP = ["grouping", "key", "series"]


@dataclass
class Histogram:
    """One group's counts per bin, the bins in ascending order; `known`: the values of
    each bin holding at most two (its least and greatest), in order."""

    bins: list[int]
    counts: list[int]
    known: dict[int, list]
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
    values: DataFrame,
    groupings: dict[str, str | None],
    fractions: dict[str, float],
    *,
    values_per_bin: int = 2,
    sums: tuple[str, ...] = (),
) -> list[dict]:
    """Percentiles of `value` per `series` (a column of `values`) and per group of each
    grouping: name -> the column whose values are its groups (as text), or None for
    one group of everything (key ""). Returns dicts of grouping, key, series, `count`
    (of non-null values) and one value per name of `fractions`. Groups without values
    are left out; rows with a null in a grouping's column are a group of their own
    there (key None).

    A bin holding at most `values_per_bin` values brings them in the first query (the
    least and greatest bring two): more than two is for values that are few (thousands,
    as the tree's hops), since Spark gathers every bin's values to pick those.

    `sums`: columns of `values` added up per group in the same first query, over every
    row (a null value's too), and returned beside; every group with rows is then
    returned, its percentiles None when it has no value."""
    binned = values.withColumn("bin", _bin("value"))
    if not sums:
        binned = binned.where(F.col("value").isNotNull())
    histograms, counts = _histograms(binned, groupings, values_per_bin, sums)
    wanted = {group: _ranks(h.total, fractions) for group, h in histograms.items()}
    found = _values_at(binned, groupings, histograms, wanted, counts)
    totals = _summed(counts, groupings, sums) if sums else {}
    return [
        {
            **_interpolated(group, histograms, wanted, found, fractions),
            **totals.get(group, {}),
        }
        for group in sorted(histograms.keys() | totals.keys(), key=_in_order)
    ]


def _summed(counts, groupings: dict[str, str | None], sums: tuple[str, ...]) -> dict:
    """(grouping, key, series) -> each of `sums` added up over the group's rows."""
    totals = {}
    for grouping, column in groupings.items():
        by = [column, "series"] if column else ["series"]
        added = counts.group_by(by).aggregate([(c, "sum") for c in sums])
        keys = added[column].to_pylist() if column else [None] * added.num_rows
        parts = [added[name].to_pylist() for name in ("series", *(f"{c}_sum" for c in sums))]
        for key, series, *figures in zip(keys, *parts, strict=True):
            group = (grouping, _key_text(key, column), series)
            totals[group] = dict(zip(sums, figures, strict=True))
    return totals


def _key_text(key, column: str | None) -> str | None:
    """A group's key as text, as Spark casts it ("" for a grouping of everything)."""
    return "" if column is None else None if key is None else str(key)


def _in_order(group: tuple) -> tuple:
    # A group whose key is null (a row without a value of the column grouped by) first.
    return tuple((part is not None, part or "") for part in group)


def _bin(column: str) -> Column:
    """A bin number that never decreases as the value grows (negatives included)."""
    magnitude = f"floor(log2(abs(`{column}`) + 1) * {BINS_PER_DOUBLING})"
    return F.expr(f"CASE WHEN `{column}` < 0 THEN -{magnitude} ELSE {magnitude} END")


def _key(column: str | None) -> str:
    """A group's key as SQL text: the column's value as text, or '' for everything."""
    return f"CAST(`{column}` AS STRING)" if column else "''"


def _in_groups(frame: DataFrame, groupings: dict[str, str | None], *columns: str) -> DataFrame:
    """Each row of `frame` once per grouping, with its group there: grouping, key,
    series and `columns`. (Written as SQL text: one call to Spark, not dozens.)"""
    groups = ", ".join(
        f"named_struct('grouping', {sql_text(name)}, 'key', {_key(column)})"
        for name, column in groupings.items()
    )
    return frame.selectExpr("series", *columns, f"explode(array({groups})) AS g").select(
        "g.grouping", "g.key", "series", *columns
    )


def _histograms(
    binned: DataFrame, groupings: dict[str, str | None], values_per_bin: int, sums: tuple
) -> tuple[dict, object]:
    """The first query: per group, its counts per bin. Spark counts the values per
    finest group and bin (one shuffle), and those counts come to the driver as Arrow,
    where each grouping adds them up: a few thousand counts per group, read in bulk,
    rather than two more shuffles and rows of Python objects. Returns the histograms,
    and the counts per finest group and bin (an Arrow table)."""
    finest = list(dict.fromkeys(column for column in groupings.values() if column))
    figures = [
        F.count("value").alias("n"),
        F.min("value").alias("least"),
        F.max("value").alias("most"),
        *[F.sum(column).alias(column) for column in sums],
    ]
    if values_per_bin > 2:
        few = F.count("value") <= values_per_bin
        figures.append(F.when(few, F.collect_list("value")).alias("values"))
    counted = binned.groupBy(*finest, "series", "bin").agg(*figures)
    counts = counted.toArrow()
    with_values = counts.filter(pc.is_valid(counts["bin"]))  # a null value has no bin
    histograms = {}
    for name, column in groupings.items():
        histograms.update(_regrouped(with_values, name, column))
    return histograms, counts


def _regrouped(counts, grouping: str, column: str | None) -> dict[tuple, Histogram]:
    """The histograms of one grouping, from the counts per finest group and bin."""
    by = [column, "series", "bin"] if column else ["series", "bin"]
    figures = [("n", "sum"), ("least", "min"), ("most", "max")]
    brought = "values" in counts.column_names
    if brought:
        missing = pc.cast(pc.is_null(counts["values"]), pa.int64())
        counts = counts.append_column("missing", missing)
        figures.append(("missing", "sum"))
    summed = counts.group_by(by).aggregate(figures).sort_by([(c, "ascending") for c in by])
    lists = _brought(counts, by) if brought else {}
    per_group: dict[tuple, tuple[list, list, dict]] = {}
    keys = summed[column].to_pylist() if column else [None] * summed.num_rows
    names = ["series", "bin", "n_sum", "least_min", "most_max"]
    missing = summed["missing_sum"].to_pylist() if brought else [None] * summed.num_rows
    for key, series, bin_, n, least, most, none_missing in zip(
        keys, *(summed[name].to_pylist() for name in names), missing, strict=True
    ):
        text = _key_text(key, column)
        bins, counted, known = per_group.setdefault((grouping, text, series), ([], [], {}))
        bins.append(bin_)
        counted.append(n)
        if n <= 2:
            known[bin_] = [least, most][:n]
        elif none_missing == 0:  # every finest group's values came
            place = (key, series, bin_) if column else (series, bin_)
            known[bin_] = sorted(lists[place])
    return {group: Histogram(*parts) for group, parts in per_group.items()}


def _brought(counts, by: list[str]) -> dict[tuple, list]:
    """The values the first query brought, per group of `by` (the bins' lists joined)."""
    have = counts.filter(pc.is_valid(counts["values"]))
    parents = pc.list_parent_indices(have["values"])
    flat = pa.table(
        {c: pc.take(have[c], parents) for c in by} | {"value": pc.list_flatten(have["values"])}
    )
    grouped = flat.group_by(by).aggregate([("value", "list")])
    places = zip(*(grouped[c].to_pylist() for c in by), strict=True)
    return dict(zip(places, grouped["value_list"].to_pylist(), strict=True))


def _ranks(count: int, fractions: dict[str, float]) -> dict[str, tuple[float, int, int]]:
    """Per fraction: its position among `count` sorted values, and the ranks around it."""
    ranks = {}
    for name, fraction in fractions.items():
        position = fraction * (count - 1)
        ranks[name] = (position, math.floor(position), math.ceil(position))
    return ranks


def _values_at(
    binned: DataFrame, groupings: dict, histograms: dict, wanted: dict, counts
) -> dict[tuple, float]:
    """(group, rank) -> the value of that rank, for every rank wanted: from the bins'
    known values, else by a second query."""
    places = {
        (group, rank): (group, *histograms[group].locate(rank))
        for group, ranks in wanted.items()
        for _, low, high in ranks.values()
        for rank in (low, high)
    }
    found = {place: _known(histograms, place) for place in set(places.values())}
    unknown = {place for place, value in found.items() if value is None}
    if unknown:
        brought = _values_in_bins(counts, unknown) <= FETCHED_VALUES
        found.update((_fetched if brought else _picked)(binned, groupings, unknown))
    return {group_rank: found[place] for group_rank, place in places.items()}


def _values_in_bins(counts, places: set[tuple]) -> int:
    """How many values lie in the bins of `places` (of any group)."""
    bins = pa.array(sorted({bin_ for _, bin_, _ in places}), counts["bin"].type)
    return pc.sum(counts.filter(pc.is_in(counts["bin"], bins))["n"]).as_py() or 0


def _fetched(binned: DataFrame, groupings: dict, places: set[tuple]) -> dict:
    """(group, bin, offset) -> the value there, for each of `places`: the values of
    the bins wanted come to the driver as Arrow (a filter: no shuffle, no sort in
    Spark), where each group's are sorted."""
    finest = list(dict.fromkeys(column for column in groupings.values() if column))
    bins = ", ".join(str(bin_) for bin_ in sorted({bin_ for _, bin_, _ in places}))
    values = binned.where(F.expr(f"bin IN ({bins})")).select(*finest, "series", "bin", "value")
    table = values.toArrow()
    offsets: dict[tuple, list[int]] = {}
    for group, bin_, offset in places:
        offsets.setdefault((*group, bin_), []).append(offset)
    found = {}
    for name, column in groupings.items():
        for (_, key, series, bin_), in_bin in _binned_values(table, name, column).items():
            wanted_here = offsets.get((name, key, series, bin_), ())
            in_order = sorted(in_bin) if wanted_here else in_bin
            for offset in wanted_here:
                found[((name, key, series), bin_, offset)] = in_order[offset]
    return found


def _binned_values(table, grouping: str, column: str | None) -> dict[tuple, list]:
    """(grouping, key, series, bin) -> the values there, from `table`."""
    by = [column, "series", "bin"] if column else ["series", "bin"]
    lists = table.group_by(by).aggregate([("value", "list")])
    keys = lists[column].to_pylist() if column else [""] * lists.num_rows
    parts = (lists[c].to_pylist() for c in ("series", "bin", "value_list"))
    return {
        (grouping, key if key is None or column is None else str(key), series, bin_): values
        for key, series, bin_, values in zip(keys, *parts, strict=True)
    }


def _known(histograms: dict, place: tuple):
    """The value at (group, bin, offset) when its bin's values are known, else None."""
    group, bin_, offset = place
    values = histograms[group].known.get(bin_)
    return values[offset] if values is not None else None


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
    texts = ", ".join(f"coalesce(CAST(`{c}` AS STRING), {sql_text(NULL_TEXT)})" for c in columns)
    return F.expr(f"concat_ws({sql_text(PLACE_SEPARATOR)}, {texts})")


def _place_text(values: tuple) -> str:
    return PLACE_SEPARATOR.join(NULL_TEXT if v is None else str(v) for v in values)


def _flat(places: set[tuple]) -> list[tuple]:
    return [(*group, bin_, offset) for group, bin_, offset in places]


def _interpolated(
    group: tuple, histograms: dict, wanted: dict, found: dict, fractions: dict[str, float]
) -> dict:
    grouping, key, series = group
    histogram = histograms.get(group)
    row = {"grouping": grouping, "key": key, "series": series, "count": 0}
    row.update(dict.fromkeys(fractions))
    if histogram is None:  # rows, but no value (see `sums`)
        return row
    row["count"] = histogram.total
    for name in fractions:
        position, low, high = wanted[group][name]
        low_value, high_value = found[(group, low)], found[(group, high)]
        row[name] = low_value + (position - math.floor(position)) * (high_value - low_value)
    return row
