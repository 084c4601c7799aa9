"""Tree efficiency: per dispatcher and per level of the tree, the events routed, the
forwards and the wasted ones, the deliveries, the summaries' sizes and coagulation loss,
and how long a hop takes.

Traffic is read from the hops (one row per event per dispatcher it passed, written by
the dispatcher once it had processed the event) whose time is in the window, with the
console's tree page's definitions (broker.reads.tree): `routed` counts the hops,
`forwards` the children they were sent down to, `wasted` the events that came down into
the dispatcher and went nowhere, `deliveries` the deliveries made (at leaves); a
dispatcher is flagged when its wasted forwards are many (tree_metrics.is_wasteful).

Hop latency, in milliseconds, of a hop at dispatcher D:
- a hop down into D: from the latest hop of the same event at D's parent no later than
  it (the parent's step that sent it down; for an event resent to a child whose summary
  grew, that is the parent's first step, so the wait for the growth is included);
- a hop up into D: from the latest hop up of the same event at one of D's children no
  later than it.
A hop's time is when its dispatcher had processed the event, so the latency is the wait
in D's inbox plus D's processing (at a leaf, delivery included). The event's first hop
(up, at its sender's leaf) has no hop before it and is not measured, nor is a hop whose
predecessor lies before the window. p50 and p95 are exact, interpolated between the two
nearest ranks over microseconds, as the latency report's are (reports.jobs.percentiles).

Summary sizes and loss are the dispatchers' stored summaries as exported (a snapshot,
whatever the window). A level's loss pools its coagulated summaries' samples.

Region: with `params.region`, only the hops of events sent by that region's clients
(the sender is the one client a hop involves); summary figures are the dispatchers'
own, whatever the region.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from broker.reads.tree import coagulation_loss, is_coagulated, is_wasteful
from reports.jobs import frames, percentiles
from reports.results import Field, Params, Result, Section
from reports.spark import Dataset

MAX_DISPATCHERS = 1000  # rows of the dispatchers section; a tree has far fewer
PERCENTILES = {"p50": 0.5, "p95": 0.95}
# Hops are few (a few per event and dispatcher): a bin of hop latencies holding up to
# this many brings them in the percentiles' first query, sparing the second.
VALUES_PER_BIN = 64
# The groupings of the hops, by the column grouped by, and what is added up per group.
GROUPINGS = {"dispatcher": "dispatcher_id", "level": "depth", "overall": None}
TRAFFIC_SUMS = ("routed", "entered", "wasted", "delivered", "forwards")

TRAFFIC_FIELDS = (
    Field("routed", "Events routed", "int"),
    Field("entered", "Events entering here (sent by its clients)", "int"),
    Field("forwards", "Forwards", "int"),
    Field("wasted", "Wasted forwards", "int"),
    Field("wasted_share", "Wasted share of routed", "percent"),
    Field("deliveries", "Deliveries", "int"),
    Field("latency_hops", "Hops measured", "int"),
    Field("latency_p50_ms", "Hop latency p50 (ms)", "float"),
    Field("latency_p95_ms", "Hop latency p95 (ms)", "float"),
)
SUMMARY_FIELDS = (
    Field("filters", "Summary filters", "int"),
    Field("constraints", "Summary constraints", "int"),
    Field("exact_filters", "Exact filters before coagulation", "int"),
    Field("summary_bytes", "Summary bytes", "int"),
    Field("loss_sampled", "Loss: events sampled", "int"),
    Field("loss_extra", "Loss: events accepted only by coagulation", "int"),
    Field("loss", "Coagulation loss", "percent"),
)
SECTIONS: dict[str, Section] = {
    "dispatchers": Section(
        "Per dispatcher",
        (
            Field("dispatcher", "Dispatcher"),
            Field("depth", "Level", "int"),
            Field("is_leaf", "Leaf"),
            Field("flagged", "Many wasted forwards"),
            *TRAFFIC_FIELDS,
            *SUMMARY_FIELDS,
        ),
    ),
    "levels": Section(
        "Per level",
        (
            Field("depth", "Level", "int"),
            Field("dispatchers", "Dispatchers", "int"),
            *TRAFFIC_FIELDS,
            *SUMMARY_FIELDS,
        ),
    ),
}
SUMMED = ("routed", "entered", "forwards", "wasted", "deliveries", "latency_hops")
SUMMARY_SUMS = ("filters", "constraints", "exact_filters", "summary_bytes")


def run(data: Dataset, params: Params) -> Result:
    """The tree's efficiency over the window (see the module's docstring)."""
    figures = _figures(_window_hops(data, params))
    by_dispatcher = {
        int(key): row for (grouping, key), row in figures.items() if grouping == "dispatcher"
    }
    by_level = {int(key): row for (grouping, key), row in figures.items() if grouping == "level"}
    dispatchers = _dispatcher_rows(data, by_dispatcher)
    levels = _level_rows(dispatchers, by_level)
    return Result(
        summary=_summary(dispatchers, figures.get(("overall", ""), {})),
        sections={"dispatchers": dispatchers, "levels": levels},
    )


def keep(data: Dataset) -> None:
    """Keep what this report reads beyond the tables (a warm session's start-up)."""
    hops_with_previous(data)


def _window_hops(data: Dataset, params: Params) -> DataFrame:
    """The hops in the window (of the region's senders' events) as the percentiles
    read them: per dispatcher and depth, the series "hop", its latency as `value` (µs,
    null when not measured), and the traffic added up: `routed` (1), `entered` (1 for
    an event's first hop in the window: up, with no hop below it there), `wasted`,
    `delivered` and `forwards`.

    The hop before a hop within the window is its hop before among all hops
    (`previous_at`) when that one is in the window too; when it lies before the window,
    so do all its others: the hop is then not measured, and a hop up entered."""
    condition = frames.window_text("at", params)
    if params.region:
        condition += f" AND sender_region = {frames.sql_text(params.region)}"
    measured = frames.at_or_after_text("previous_at", params.window_start)
    # Text, not Column objects: one call to Spark, not dozens (a tenth of a second).
    return hops_with_previous(data).where(condition).selectExpr(
        "dispatcher_id", "depth", "'hop' AS series",
        f"CASE WHEN {measured} THEN unix_micros(at) - unix_micros(previous_at) END AS value",
        "1 AS routed",
        f"CAST(direction = 'up' AND NOT {measured} AS BIGINT) AS entered",
        "wasted", "delivered", "forwarded AS forwards",
    )  # fmt: skip


def hops_with_previous(data: Dataset) -> DataFrame:
    """Every hop with its dispatcher's parent and depth, the time of the hop before it
    (`previous_at`, null for none) and its event's sender's region: computed once and
    kept by a warm session, so that a run is a filter of it (grouping every hop by its
    event was a shuffle of its own, at every run)."""
    return data.derived(
        "hops with the hop before",
        ("hops", "dispatchers", "events", "clients"),
        lambda: _with_sender_region(data, _with_previous(_tree_hops(data))),
    )


def _tree_hops(data: Dataset) -> DataFrame:
    """Every hop with its dispatcher's parent and depth."""
    tree = data.table("dispatchers").select(
        F.col("id").alias("dispatcher_id"), "parent_id", "depth"
    )
    return data.table("hops").join(F.broadcast(tree), "dispatcher_id").select(
        "event_id", "dispatcher_id", "parent_id", "depth", "direction", "at",
        "forwarded", "delivered", "wasted",
    )  # fmt: skip


def _with_sender_region(data: Dataset, hops: DataFrame) -> DataFrame:
    """`hops` with `sender_region`: the region of the client that sent its event."""
    regions = data.table("clients").select(
        F.col("id").alias("sender_id"), F.col("region").alias("sender_region")
    )
    senders = data.table("events").select(F.col("id").alias("event_id"), "sender_id")
    of_event = senders.join(regions, "sender_id").drop("sender_id")
    return hops.join(of_event, "event_id", "left").drop("event_id")


# For one hop `x` among its event's hops `hops`: the time of the hop before it.
PREVIOUS_AT = """
CASE WHEN x.direction = 'down' THEN
    array_max(transform(
        filter(hops, y -> y.dispatcher_id = x.parent_id AND y.at <= x.at), y -> y.at))
ELSE
    array_max(transform(
        filter(hops, y -> y.direction = 'up' AND y.parent_id = x.dispatcher_id
                          AND y.at <= x.at), y -> y.at))
END
"""


def _with_previous(hops: DataFrame) -> DataFrame:
    """Each hop with `previous_at`, its event's hops side by side."""
    columns = [c for c in hops.columns if c != "event_id"]
    per_event = hops.groupBy("event_id").agg(F.collect_list(F.struct(*columns)).alias("hops"))
    fields = ", ".join(f"'{c}', x.{c}" for c in columns)
    measured = F.expr(f"transform(hops, x -> named_struct({fields}, 'previous_at', {PREVIOUS_AT}))")
    return per_event.select("event_id", F.explode(measured).alias("hop")).select(
        "event_id", "hop.*"
    )


def _figures(hops: DataFrame) -> dict[tuple[str, str], dict]:
    """(grouping, group's key as text) -> the traffic of each dispatcher, level and
    the whole tree, and its hop latency's p50 and p95 in ms, in one query: the traffic
    added up beside the latencies' counts per bin (reports.jobs.percentiles)."""
    found = percentiles.percentiles(
        hops, GROUPINGS, PERCENTILES, values_per_bin=VALUES_PER_BIN, sums=TRAFFIC_SUMS
    )
    return {(row["grouping"], row["key"]): _traffic(row) for row in found}


def _traffic(row: dict) -> dict:
    latency = tuple(None if row[name] is None else row[name] / 1000.0 for name in PERCENTILES)
    return {
        **{name: row[name] for name in TRAFFIC_SUMS},
        "latency_hops": row["count"],
        "latency": latency,
    }


def _dispatcher_rows(data: Dataset, traffic: dict[int, dict]) -> list[dict]:
    """Every dispatcher (with or without traffic), root first, by level and name."""
    tree = sorted(data.rows("dispatchers"), key=lambda d: (d["depth"], d["name"]))
    return [_dispatcher_row(d.asDict(), traffic.get(d["id"], {})) for d in tree[:MAX_DISPATCHERS]]


def _dispatcher_row(dispatcher: dict, traffic: dict) -> dict:
    row = {
        "dispatcher": dispatcher["name"],
        "depth": dispatcher["depth"],
        "is_leaf": dispatcher["is_leaf"],
        **_traffic_figures(traffic),
        **{name: dispatcher[name] for name in (*SUMMARY_SUMS, "loss_sampled", "loss_extra")},
    }
    row["loss_sampled"] = row["loss_sampled"] or 0
    row["loss_extra"] = row["loss_extra"] or 0
    row["loss"] = coagulation_loss(
        row["filters"], row["exact_filters"], row["loss_sampled"], row["loss_extra"]
    )
    row["flagged"] = is_wasteful(row["wasted"], row["routed"])
    return row


def _traffic_figures(traffic: dict) -> dict:
    figures = {name: traffic.get(name) or 0 for name in SUMMED if name != "deliveries"}
    figures["deliveries"] = traffic.get("delivered") or 0
    routed = figures["routed"]
    figures["wasted_share"] = figures["wasted"] / routed if routed else None
    p50, p95 = traffic.get("latency") or (None, None)
    figures["latency_p50_ms"], figures["latency_p95_ms"] = p50, p95
    return figures


def _level_rows(dispatchers: list[dict], traffic: dict[int, dict]) -> list[dict]:
    depths = sorted({row["depth"] for row in dispatchers})
    return [_level_row(depth, dispatchers, traffic.get(depth, {})) for depth in depths]


def _level_row(depth: int, dispatchers: list[dict], traffic: dict) -> dict:
    here = [row for row in dispatchers if row["depth"] == depth]
    sizes = {name: sum(row[name] or 0 for row in here) for name in SUMMARY_SUMS}
    return {
        "depth": depth,
        "dispatchers": len(here),
        **_traffic_figures(traffic),
        **sizes,
        **_pooled_loss(here),
    }


def _pooled_loss(dispatchers: list[dict]) -> dict:
    """A level's loss: its coagulated summaries' extra events over their samples (0
    when none was coagulated, None when they were but nothing was sampled)."""
    coagulated = [d for d in dispatchers if is_coagulated(d["filters"], d["exact_filters"])]
    sampled = sum(d["loss_sampled"] for d in coagulated)
    extra = sum(d["loss_extra"] for d in coagulated)
    loss = (extra / sampled if sampled else None) if coagulated else 0.0
    return {"loss_sampled": sampled, "loss_extra": extra, "loss": loss}


def _summary(dispatchers: list[dict], total: dict) -> dict:
    figures = _traffic_figures(total)
    return {
        "dispatchers": len(dispatchers),
        "events": figures.pop("entered"),
        **figures,
        "flagged": sum(row["flagged"] for row in dispatchers),
    }
