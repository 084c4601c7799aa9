"""Delivery latency: the median, 95th and 99th percentiles of the time from publishing
an event to its delivery (recorded for the receiver by its leaf) and to its
acknowledgement (the agent's answer, ok or failed), per hop count, per region, and
overall.

A delivery's hop count is the number of dispatchers on the tree path from the sender's
leaf to the receiver's leaf: up to their lowest common ancestor and down, each counted
once (1 when both are on the same leaf). It is worked out once per pair of leaves (the
window's senders' leaves and every leaf) from the dispatchers table (a few hundred rows),
never per delivery.

Percentiles are exact, interpolated between the two nearest ranks as Spark's
`percentile` and numpy's default are, over microseconds (reports.jobs.percentiles).
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from broker.services.tree import MAX_DEPTH
from reports.jobs import frames, percentiles
from reports.results import Field, Params, Result, Section
from reports.spark import Dataset, small_frame

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
    figures = _figures_by_group(_with_hops(data, params))
    sections = {name: _section_rows(figures, name, key) for name, key in GROUPINGS.items()}
    overall = sections["overall"][0] if sections["overall"] else {}
    summary = {
        "deliveries": overall.get("delivery_count", 0),
        "acknowledged": overall.get("ack_count", 0),
        "percentiles": "exact",
        "region": params.region,
    }
    return Result(summary=summary, sections=sections)


def keep(data: Dataset) -> None:
    """Keep what this report reads beyond the tables (a warm session's start-up)."""
    deliveries_with_hops(data)


def _with_hops(data: Dataset, params: Params) -> DataFrame:
    """The window's deliveries (to the region's receivers) with their delays (µs) and
    their hop count."""
    deliveries = deliveries_with_hops(data).where(frames.in_window("published_at", params))
    return frames.in_region(deliveries, params).select("hops", "region", "delivery", "ack")


def deliveries_with_hops(data: Dataset) -> DataFrame:
    """Every delivery to a client with its publishing time, its receiver's region, its
    hop count and its delays: worked out once and kept by a warm session (an export's
    new deliveries alone), so that a run neither joins nor works out paths."""
    return data.derived_rows(
        "deliveries with their hops",
        "deliveries",
        ("clients", "dispatchers"),
        lambda deliveries: _hops_of(data, deliveries),
    )


def _hops_of(data: Dataset, deliveries: DataFrame) -> DataFrame:
    """`deliveries` with their delays (µs) and their hop count (0 when the sender or
    the receiver is on no leaf)."""
    received = frames.with_receivers(data, deliveries)
    senders = _sender_leaves(data, received)
    pairs = _hops_between_leaves(data, set(senders.values()))
    # Both a few rows: a delivery finds its hop count by two joins on numbers.
    senders_frame = small_frame(
        data.spark, list(senders.items()), "sender_id long, sender_dispatcher long"
    )
    pairs_frame = small_frame(
        data.spark, pairs, "sender_dispatcher long, receiver_dispatcher long, hops int"
    )
    return (
        received.join(F.broadcast(senders_frame), "sender_id", "left")
        .join(F.broadcast(pairs_frame), ["sender_dispatcher", "receiver_dispatcher"], "left")
        .select(
            "id", "published_at", "region",
            F.coalesce(F.col("hops"), F.lit(0)).alias("hops"),
            frames.micros_between("published_at", "delivered_at").alias("delivery"),
            frames.micros_between("published_at", "acked_at").alias("ack"),
        )
    )  # fmt: skip


def _sender_leaves(data: Dataset, deliveries: DataFrame) -> dict[int, int]:
    """{sender: its leaf} for the senders of `deliveries` that are on one."""
    senders = deliveries.select("sender_id").distinct()
    placed = (
        data.table("clients")
        .where(F.col("dispatcher_id").isNotNull())
        .select(F.col("id").alias("sender_id"), "dispatcher_id")
        .join(F.broadcast(senders), "sender_id", "left_semi")
    )
    return {row["sender_id"]: row["dispatcher_id"] for row in placed.collect()}


def _hops_between_leaves(data: Dataset, sender_leaves: set[int]) -> list[tuple[int, int, int]]:
    """(sender's leaf, receiver's dispatcher, hops) from each of `sender_leaves` to
    every dispatcher of the tree: steps up to their nearest common ancestor and down,
    plus one. The tree is the dispatchers table (a few hundred rows at most)."""
    parents = {row["id"]: row["parent_id"] for row in data.rows("dispatchers")}
    paths = {dispatcher: _path_up(dispatcher, parents) for dispatcher in parents}
    pairs = []
    for sender_leaf in sender_leaves & paths.keys():
        up_from_sender = paths[sender_leaf]
        for dispatcher, up_from_receiver in paths.items():
            common = up_from_sender.keys() & up_from_receiver.keys()
            if common:
                steps = min(up_from_sender[a] + up_from_receiver[a] for a in common)
                pairs.append((sender_leaf, dispatcher, steps + 1))
    return pairs


def _path_up(dispatcher: int, parents: dict[int, int | None]) -> dict[int, int]:
    """{ancestor: steps up} from `dispatcher` (itself at 0) to the root; the tree is
    at most MAX_DEPTH levels deep."""
    path, steps, at = {}, 0, dispatcher
    while at is not None and at not in path and steps < MAX_DEPTH:
        path[at] = steps
        at, steps = parents.get(at), steps + 1
    return path


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
