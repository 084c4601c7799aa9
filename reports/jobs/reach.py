"""Reach and containment per command: how many receivers each event of the window
targeted, how many got it, answered ok, failed, have not answered, or expired without
getting it (the event page's counts, broker.reads.progress); how long until 50, 90 and 99 %
of those targeted had acknowledged ok; the same per region; and who never answered.

Times to acknowledge are order statistics: the k-th acknowledgement of an event, for
k = ceil(p * targeted). They come from one aggregation per (event, region) that keeps
the acknowledgement delays, sorted within each group, instead of a window sort over
every delivery.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from reports.jobs import frames
from reports.results import Field, Params, Result, Section
from reports.spark import Dataset

MAX_ROWS = 10_000  # per section; the summary says how many there were
PERCENTS = (50, 90, 99)
COUNT_NAMES = ("targeted", "delivered", "acked_ok", "failed", "no_answer", "expired")

COUNTS = (
    Field("targeted", "Targeted", "int"),
    Field("delivered", "Received", "int"),
    Field("acked_ok", "Acknowledged ok", "int"),
    Field("failed", "Failed", "int"),
    Field("no_answer", "No answer yet", "int"),
    Field("expired", "Expired undelivered", "int"),
    *(Field(f"t{p}_s", f"{p} % acknowledged ok after", "seconds") for p in PERCENTS),
)
SECTIONS = {
    "commands": Section(
        "Reach per event",
        (
            Field("event", "Event"),
            Field("published_at", "Published", "time"),
            Field("sender", "Sender"),
            Field("kind", "Kind"),
            Field("action", "Action"),
            Field("selector", "Selector"),
            *COUNTS,
        ),
    ),
    "regions": Section(
        "Reach per event and region",
        (Field("event", "Event"), Field("region", "Region"), *COUNTS),
    ),
    "never_answered": Section(
        "Receivers that never answered",
        (
            Field("event", "Event"),
            Field("receiver", "Receiver"),
            Field("region", "Region"),
            Field("state", "State"),
            Field("delivered_at", "Recorded for it", "time"),
        ),
    ),
}


def run(data: Dataset, params: Params) -> Result:
    """The reach report over the events published in the window."""
    tallies = tallies_kept(data).where(frames.in_window("published_at", params))
    by_region = tallies.where(F.col("region").isNotNull())
    if params.region:
        by_region = totals = by_region.where(F.col("region") == params.region)
    else:
        totals = tallies.where(F.col("region").isNull())
    events = frames.window_events(data, params)
    by_event = _described(totals, events, regional=bool(params.region))
    commands = frames.rows(by_event, SECTIONS["commands"].field_names, limit=MAX_ROWS)
    sections = {
        "commands": commands,
        "regions": frames.rows(
            _ordered_regions(by_region), SECTIONS["regions"].field_names, limit=MAX_ROWS
        ),
        "never_answered": _never_answered(data, params),
    }
    return Result(summary=_summary(by_event, commands, params), sections=sections)


def keep(data: Dataset) -> None:
    """Keep what this report reads beyond the tables (a warm session's start-up)."""
    tallies_kept(data)
    never_answered_kept(data)


def tallies_kept(data: Dataset) -> DataFrame:
    """Per event and region of its receivers, and per event (`region` null): the
    counts and the times to 50/90/99 % acknowledged ok. Worked out once and kept by a
    warm session (an export's new deliveries: their events' rows again): a window
    takes whole events (a delivery carries its event's publishing time) and a region
    whole rows, so a run filters a row per event and region, and neither groups nor
    sorts a delivery."""

    def build(events: DataFrame | None) -> DataFrame:
        deliveries = frames.deliveries_to_receivers(data)
        if events is not None:  # only these events' (an export's new deliveries')
            deliveries = deliveries.join(F.broadcast(events), "event_id", "left_semi")
        by_region = _tallies_by_region(deliveries)
        by_event = by_region.groupBy("event_id", "published_at").agg(
            *(F.sum(name).alias(name) for name in COUNT_NAMES),
            F.flatten(F.collect_list("delays")).alias("delays"),
        )
        whole = by_event.withColumn("region", F.lit(None).cast("string"))
        return _with_times(by_region.unionByName(whole)).drop("delays")

    name = "reach per event and region"
    return data.derived_by_key(name, "deliveries", "event_id", ("clients",), build)


def never_answered_kept(data: Dataset) -> DataFrame:
    """Every delivery to a client that was never answered (see `_never_answered`),
    with its receiver: kept by a warm session and brought up to date row by row (an
    answer exported later takes its delivery out), so that a run orders these, not
    every delivery."""

    def build(deliveries: DataFrame) -> DataFrame:
        found = frames.with_receivers(data, deliveries)
        return found.where(frames.is_state(*frames.NEVER_ANSWERED_STATES)).select(
            "id", "event_id", "published_at", "receiver", "region", "state", "delivered_at"
        )

    return data.derived_rows("deliveries never answered", "deliveries", ("clients",), build)


def _tallies_by_region(deliveries: DataFrame) -> DataFrame:
    """Counts per (event, region), and the delays of its ok acknowledgements (µs).
    (An event has one publishing time: grouping by it too carries it along.)"""
    delays = F.when(
        frames.is_state(frames.State.ACKED), frames.micros_between("published_at", "acked_at")
    )
    return deliveries.groupBy("event_id", "published_at", "region").agg(
        *frames.state_counts(), F.collect_list(delays).alias("delays")
    )


def _described(totals: DataFrame, events: DataFrame, *, regional: bool) -> DataFrame:
    """Every event of the window with its `totals` (0 and no times for none); for one
    region, only the events that reached it."""
    described = events.select(
        F.col("id").alias("event_id"), "published_at", "sender", "kind", "action", "selector"
    )
    joined = described.join(
        totals.drop("published_at"), "event_id", "inner" if regional else "left"
    )
    return joined.fillna(0, subset=list(COUNT_NAMES)).select(
        F.col("event_id").alias("event"),
        frames.iso("published_at").alias("published_at"),
        "sender", "kind", "action", "selector", *COUNT_NAMES, *_time_names(),
    ).orderBy("published_at", "event")  # fmt: skip


def _ordered_regions(by_region: DataFrame) -> DataFrame:
    return by_region.orderBy("published_at", "event_id", "region").select(
        F.col("event_id").alias("event"), "region", *COUNT_NAMES, *_time_names()
    )


def _with_times(tallies: DataFrame) -> DataFrame:
    """t50_s, t90_s, t99_s: seconds from publishing to the acknowledgement that brought
    acknowledged-ok to that share of those targeted (null if it never did)."""
    sorted_delays = F.sort_array(F.coalesce(F.col("delays"), F.array()))
    tallies = tallies.withColumn("delays", sorted_delays)
    for percent in PERCENTS:
        tallies = tallies.withColumn(f"t{percent}_s", _time_to(percent))
    return tallies


def _time_to(percent: int) -> Column:
    # The k-th acknowledgement, k = ceil(percent% of targeted), in whole numbers.
    k = F.expr(f"({percent} * targeted + 99) div 100")
    reached = (k >= 1) & (F.size("delays") >= k)
    return F.when(reached, frames.seconds(F.get(F.col("delays"), k - 1)))


def _time_names() -> list[str]:
    return [f"t{percent}_s" for percent in PERCENTS]


def _never_answered(data: Dataset, params: Params) -> list[dict]:
    """The first MAX_ROWS receivers of the window's deliveries (the region's) that
    never answered, by event then name."""
    unanswered = never_answered_kept(data).where(frames.in_window("published_at", params))
    ordered = (
        frames.in_region(unanswered, params)
        .orderBy("published_at", "event_id", "receiver")
        .select(
            F.col("event_id").alias("event"),
            "receiver",
            "region",
            "state",
            frames.iso("delivered_at").alias("delivered_at"),
        )
    )
    return frames.rows(ordered, SECTIONS["never_answered"].field_names, limit=MAX_ROWS)


def _summary(by_event: DataFrame, commands: list[dict], params: Params) -> dict:
    """Totals over every event of the window: added up from the `commands` rows when
    they are all of them (fewer than MAX_ROWS: no query), else counted by Spark."""
    if len(commands) < MAX_ROWS:
        totals = {name: sum(row[name] for row in commands) for name in COUNT_NAMES}
        totals["events"] = len(commands)
    else:
        totals = by_event.agg(
            F.count(F.lit(1)).alias("events"), *(F.sum(name).alias(name) for name in COUNT_NAMES)
        ).first()
    summary = {name: int(totals[name] or 0) for name in ("events", *COUNT_NAMES)}
    # Every receiver a resend would go to (broker.reads.progress.UNANSWERED_STATES).
    summary["never_answered"] = summary["no_answer"] + summary["expired"]
    summary["rows_limit"] = MAX_ROWS
    summary["region"] = params.region
    return summary
