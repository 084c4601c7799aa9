"""Delivery latency: the median, 95th and 99th percentiles of the time from publishing
an event to its delivery (recorded for the receiver by its leaf) and to its
acknowledgement (the agent's answer, ok or failed), per hop count, per region, and
overall.

A delivery's hop count is the number of dispatchers on the tree path from the sender's
leaf to the receiver's leaf: up to their lowest common ancestor and down, each counted
once (1 when both are on the same leaf). It is worked out once per pair of leaves from
the dispatchers table (a few hundred rows), never per delivery.

Percentiles are exact, interpolated between the two nearest ranks as Spark's
`percentile` and numpy's default are, over microseconds (reports.jobs.percentiles).
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from broker.services.tree import MAX_DEPTH
from reports.jobs import frames, percentiles
from reports.results import Field, Params, Result, Section
from reports.spark import Dataset

PERCENTILES = (("p50", 0.5), ("p95", 0.95), ("p99", 0.99))
MEASURES = (("delivery", "delivered_at", "delivery"), ("ack", "acked_at", "acknowledgement"))


def _figures() -> tuple[Field, ...]:
    fields = []
    for measure, _, words in MEASURES:
        fields.append(Field(f"{measure}_count", f"Measured to {words}", "int"))
        for name, fraction in PERCENTILES:
            label = f"{words.capitalize()}: {'median' if fraction == 0.5 else name}"
            fields.append(Field(f"{measure}_{name}_s", label, "seconds"))
    return tuple(fields)


FIGURES = _figures()
SECTIONS = {
    "by_hops": Section("Latency by hop count", (Field("hops", "Hops", "int"), *FIGURES)),
    "by_region": Section("Latency by region", (Field("region", "Region"), *FIGURES)),
    "overall": Section("Latency overall", FIGURES),
}


GROUPINGS = {"by_hops": "hops", "by_region": "region", "overall": None}


def run(data: Dataset, params: Params) -> Result:
    """The latency report over the deliveries of the events published in the window."""
    figures = _figures_by_group(_with_hops(data, params, _hops_between_leaves(data)))
    sections = {name: _section_rows(figures, name, key) for name, key in GROUPINGS.items()}
    overall = sections["overall"][0] if sections["overall"] else {}
    summary = {
        "deliveries": overall.get("delivery_count", 0),
        "acknowledged": overall.get("ack_count", 0),
        "percentiles": "exact",
        "region": params.region,
    }
    return Result(summary=summary, sections=sections)


def _with_hops(data: Dataset, params: Params, hops: DataFrame) -> DataFrame:
    """The window's deliveries with their delays (µs) and their hop count (0 when the
    sender or the receiver is on no leaf)."""
    senders = data.table("clients").select(
        F.col("id").alias("sender_id"), F.col("dispatcher_id").alias("sender_dispatcher")
    )
    deliveries = frames.window_deliveries(data, params).join(
        F.broadcast(senders), "sender_id", "left"
    )
    return deliveries.join(
        F.broadcast(hops), ["sender_dispatcher", "receiver_dispatcher"], "left"
    ).select(
        F.coalesce(F.col("hops"), F.lit(0)).alias("hops"),
        "region",
        frames.micros_between("published_at", "delivered_at").alias("delivery"),
        frames.micros_between("published_at", "acked_at").alias("ack"),
    )


def _ancestors(data: Dataset) -> DataFrame:
    """(dispatcher, ancestor, steps up): every dispatcher's path to the root,
    itself at 0 steps; the tree is at most MAX_DEPTH levels deep."""
    parents = data.table("dispatchers").select(
        F.col("id").alias("ancestor"), F.col("parent_id").alias("parent")
    )
    level = data.table("dispatchers").select(
        F.col("id").alias("dispatcher"), F.col("id").alias("ancestor"), F.lit(0).alias("up")
    )
    paths = level
    for _ in range(MAX_DEPTH - 1):
        level = (
            level.join(F.broadcast(parents), "ancestor")
            .where(F.col("parent").isNotNull())
            .select("dispatcher", F.col("parent").alias("ancestor"), (F.col("up") + 1).alias("up"))
        )
        paths = paths.unionByName(level)
    return paths


def _hops_between_leaves(data: Dataset) -> DataFrame:
    """(sender_dispatcher, receiver_dispatcher, hops) for every pair of dispatchers
    that hold clients: steps up to the nearest common ancestor and down, plus one."""
    held = data.table("clients").where(F.col("dispatcher_id").isNotNull())
    leaves = held.select(F.col("dispatcher_id").alias("dispatcher")).distinct()
    paths = _ancestors(data).join(leaves, "dispatcher", "left_semi")
    up = paths.select(
        F.col("dispatcher").alias("sender_dispatcher"), "ancestor", F.col("up").alias("up_s")
    )
    down = paths.select(
        F.col("dispatcher").alias("receiver_dispatcher"), "ancestor", F.col("up").alias("up_r")
    )
    return (
        up.join(down, "ancestor")
        .groupBy("sender_dispatcher", "receiver_dispatcher")
        .agg((F.min(F.col("up_s") + F.col("up_r")) + 1).alias("hops"))
    )


def _figures_by_group(deliveries: DataFrame) -> list[dict]:
    """Every grouping's counts and percentiles of both delays, in one computation."""
    by_measure = F.explode(
        F.array(
            *(
                F.struct(F.lit(measure).alias("series"), F.col(measure).alias("value"))
                for measure, _, _ in MEASURES
            )
        )
    )
    values = deliveries.select("hops", "region", by_measure.alias("m")).select(
        "hops", "region", "m.series", "m.value"
    )
    fractions = dict(PERCENTILES)
    figures = percentiles.percentiles(values, GROUPINGS, fractions)
    for figure in figures:
        figure.update({name: figure[name] / frames.MICROS for name in fractions})
    return figures


def _section_rows(figures: list[dict], grouping: str, key: str | None) -> list[dict]:
    """One row per key of the grouping: the count and percentiles of each measure."""
    rows: dict[str, dict] = {}
    for figure in figures:
        if figure["grouping"] != grouping:
            continue
        row = rows.setdefault(figure["key"], _empty_row(key, figure["key"]))
        row[f"{figure['series']}_count"] = figure["count"]
        for name, _ in PERCENTILES:
            row[f"{figure['series']}_{name}_s"] = figure[name]
    return [rows[name] for name in sorted(rows, key=lambda k: int(k) if key == "hops" else k)]


def _empty_row(key: str | None, value: str) -> dict:
    row = {key: int(value) if key == "hops" else value} if key else {}
    row.update({field.name: None for field in FIGURES})
    for measure, _, _ in MEASURES:
        row[f"{measure}_count"] = 0
    return row
