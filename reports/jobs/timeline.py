"""The incident timeline: events by kind, sender and channel over time, with what they
delivered; sends, policy and trust changes marked on the same time axis.

Time is cut in buckets sized from the window (one minute to one day, at most
MAX_BUCKETS of them), aligned on multiples of the bucket since the epoch (whole
minutes, hours, days in UTC). An event's deliveries count in its publishing bucket.
For one region, only the events that reached its receivers count, with their
deliveries there; markers about a client count if the client is in the region, others
(sends, bulk changes, authorities) always.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from reports.jobs import frames
from reports.results import Field, Params, Result, Section
from reports.spark import Dataset

BUCKETS_S = (60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)
MAX_BUCKETS = 200
MAX_ROWS = 10_000  # per section; the summary says how many there were
# Changes marked on the timeline, by the audit action that records them.
MARKER_TYPES = {
    "event.send": "send",
    "policy.set": "policy",
    "attributes.attest": "trust",
    "attributes.renew": "trust",
    "attributes.revoke": "trust",
    "grant.create": "trust",
    "grant.revoke": "trust",
    "authority.create": "trust",
    "authority.set_capabilities": "trust",
    "authority.set_active": "trust",
    "authority.rotate_key": "trust",
}
CLIENT_TARGET = "client:"

SECTIONS = {
    "series": Section(
        "Events over time",
        (
            Field("bucket", "From", "time"),
            Field("kind", "Kind"),
            Field("sender", "Sender"),
            Field("channel", "Channel"),
            Field("events", "Events", "int"),
            Field("deliveries", "Deliveries", "int"),
        ),
    ),
    "markers": Section(
        "Sends, policy and trust changes",
        (
            Field("at", "At", "time"),
            Field("type", "Type"),
            Field("action", "Action"),
            Field("actor", "By"),
            Field("target", "Target"),
            Field("what", "What"),
        ),
    ),
    "changes": Section(
        "Policy versions and attested values over time",
        (
            Field("bucket", "From", "time"),
            Field("policy_versions", "Policy versions", "int"),
            Field("attestations", "Values attested or renewed", "int"),
            Field("revocations", "Values revoked", "int"),
        ),
    ),
    "senders": Section(
        "Senders",
        (
            Field("sender", "Sender"),
            Field("events", "Events", "int"),
            Field("deliveries", "Deliveries", "int"),
            Field("first", "First", "time"),
            Field("last", "Last", "time"),
        ),
    ),
}


def bucket_seconds(params: Params) -> int:
    """The smallest bucket that cuts the window in at most MAX_BUCKETS (one day at most)."""
    span = (params.window_end - params.window_start).total_seconds()
    return next((size for size in BUCKETS_S if span <= size * MAX_BUCKETS), BUCKETS_S[-1])


def run(data: Dataset, params: Params) -> Result:
    """The timeline of the events published in the window, and its changes."""
    bucket = bucket_seconds(params)
    events = _events_with_deliveries(data, params)
    sections = {
        "series": frames.rows(
            _series(events, bucket), SECTIONS["series"].field_names, limit=MAX_ROWS
        ),
        "senders": frames.rows(_senders(events), SECTIONS["senders"].field_names, limit=MAX_ROWS),
    }
    totals = _totals(events, sections["senders"])
    markers = _markers(data, params)
    sections["markers"] = frames.rows(markers, SECTIONS["markers"].field_names, limit=MAX_ROWS)
    # Fewer rows than the limit are all of them: a count would read the audit again.
    marker_count = len(sections["markers"])
    if marker_count >= MAX_ROWS:
        marker_count = markers.count()
    changes = _changes(data, params, bucket)
    sections["changes"] = frames.rows(changes, SECTIONS["changes"].field_names, limit=MAX_ROWS)
    summary = {
        "bucket_s": bucket,
        "events": int(totals["events"]),
        "deliveries": int(totals["deliveries"] or 0),
        "markers": marker_count,
        "rows_limit": MAX_ROWS,
        "region": params.region,
    }
    return Result(summary=summary, sections=sections)


def keep(data: Dataset) -> None:
    """Keep what this report reads beyond the tables (a warm session's start-up)."""
    for kept in (_events_counted, _events_counted_per_region, _marking_entries, _change_rows):
        kept(data)


def _totals(events: DataFrame, senders: list[dict]) -> dict:
    """Events and deliveries in all: added up from the `senders` rows when they are
    all of them (fewer than MAX_ROWS: no query), else counted by Spark."""
    if len(senders) < MAX_ROWS:
        return {name: sum(row[name] for row in senders) for name in ("events", "deliveries")}
    return events.agg(
        F.count(F.lit(1)).alias("events"), F.sum("deliveries").alias("deliveries")
    ).first()


def _events_with_deliveries(data: Dataset, params: Params) -> DataFrame:
    """The window's events, each with how many deliveries it has (to the region's
    receivers, and then only the events that have some)."""
    if not params.region:
        return _events_counted(data).where(frames.in_window("published_at", params))
    per_region = _events_counted_per_region(data).where(F.col("region") == params.region)
    return per_region.where(frames.in_window("published_at", params)).drop("region")


EVENT_COLUMNS = ("id AS event_id", "published_at", "kind", "sender", "channel")


def _events_counted(data: Dataset) -> DataFrame:
    """Every event with its deliveries' count: counted once and kept by a warm session,
    so that a run reads a row per event, not a row per delivery."""

    def build() -> DataFrame:
        counts = _delivery_counts(data, "event_id")
        events = data.table("events").selectExpr(*EVENT_COLUMNS)
        return events.join(counts, "event_id", "left").fillna(0, subset=["deliveries"])

    return data.derived("events with their deliveries", ("events", "deliveries"), build)


def _events_counted_per_region(data: Dataset) -> DataFrame:
    """Per event and region of its receivers (NO_REGION for none), its deliveries
    there: the events of a region are those with a row of it."""

    def build() -> DataFrame:
        counts = _delivery_counts(data, "event_id", "region")
        return data.table("events").selectExpr(*EVENT_COLUMNS).join(counts, "event_id")

    sources = ("events", "deliveries", "clients")
    return data.derived("events with their deliveries per region", sources, build)


def _delivery_counts(data: Dataset, *by: str) -> DataFrame:
    deliveries = frames.deliveries_to_receivers(data)
    return deliveries.groupBy(*by).agg(F.count(F.lit(1)).alias("deliveries"))


def _bucket(column: str, seconds: int) -> Column:
    epoch = F.unix_seconds(F.col(column))
    return F.timestamp_seconds(epoch - F.pmod(epoch, F.lit(seconds)))


def _series(events: DataFrame, bucket: int) -> DataFrame:
    return (
        events.withColumn("bucket", _bucket("published_at", bucket))
        .groupBy("bucket", "kind", "sender", "channel")
        .agg(F.count(F.lit(1)).alias("events"), F.sum("deliveries").alias("deliveries"))
        .orderBy("bucket", "kind", "sender", "channel")
        .withColumn("bucket", frames.iso("bucket"))
    )


def _senders(events: DataFrame) -> DataFrame:
    return (
        events.groupBy("sender")
        .agg(
            F.count(F.lit(1)).alias("events"),
            F.sum("deliveries").alias("deliveries"),
            F.min("published_at").alias("first"),
            F.max("published_at").alias("last"),
        )
        .orderBy(F.desc("deliveries"), F.desc("events"), "sender")
        .withColumn("first", frames.iso("first"))
        .withColumn("last", frames.iso("last"))
    )


def _markers(data: Dataset, params: Params) -> DataFrame:
    """The window's changes that mark the timeline (MARKER_TYPES), in time order; for
    a region, those about a client of the region and those not about one client."""
    entries = _marking_entries(data).where(frames.in_window("at", params))
    if params.region:
        about_the_region = F.col("client_region") == params.region
        entries = entries.where(about_the_region | ~F.col("about_a_client"))
    return entries.orderBy("at", "id").withColumn("at", frames.iso("at"))


def _marking_entries(data: Dataset) -> DataFrame:
    """Every audit entry that marks the timeline, with its type and gist, whether it is
    about a client (its target names one) and that client's region: picked from the
    whole audit once and kept by a warm session, so that a run reads a few rows."""

    def build(audit: DataFrame) -> DataFrame:
        done = (F.col("outcome") == "done") & F.col("action").isin(*MARKER_TYPES)
        types = F.create_map(*[F.lit(x) for pair in MARKER_TYPES.items() for x in pair])
        regions = frames.every_receiver(data).select(
            F.col("receiver").alias("_client"), F.col("region").alias("client_region")
        )
        client = F.substring_index(F.col("target"), CLIENT_TARGET, -1).alias("_client")
        columns = ("id", "at", "action", "actor", "target")
        return (
            audit.where(done)
            .select(*columns, types[F.col("action")].alias("type"), _what(), client)
            .join(F.broadcast(regions), "_client", "left")
            .withColumn("about_a_client", F.col("target").startswith(CLIENT_TARGET))
            .drop("_client")
        )

    return data.derived_rows("entries marking the timeline", "audit", ("clients",), build)


def _what() -> Column:
    """The gist of a marker, from its audit details."""
    action = F.col("action")

    def detail(path: str) -> Column:
        return F.get_json_object("details", f"$.{path}")

    sent = F.concat_ws(" ", F.lit("as"), detail("as"), F.lit("to"), detail("accepting"))
    return (
        F.when(action == "event.send", F.concat(sent, F.lit(" accepting")))
        .when(action == "policy.set", F.concat(F.lit("version "), detail("version")))
        .when(action == "attributes.attest", F.concat(F.lit("attested "), detail("values")))
        .when(action == "attributes.revoke", F.concat(F.lit("revoked "), detail("names")))
        .when(action.startswith("grant."), F.concat(F.lit("authority "), detail("authority")))
        .otherwise(F.lit(None))
        .alias("what")
    )


def _changes(data: Dataset, params: Params, bucket: int) -> DataFrame:
    """Per bucket: policy versions saved, values attested or renewed, values revoked."""
    changes = _change_rows(data).where(frames.in_window("at", params))
    if params.region:
        changes = changes.where(F.col("region") == params.region)
    return (
        changes.groupBy(_bucket("at", bucket).alias("bucket"))
        .agg(
            frames.count_where(F.col("change") == "policy").alias("policy_versions"),
            frames.count_where(F.col("change") == "attested").alias("attestations"),
            frames.count_where(F.col("change") == "revoked").alias("revocations"),
        )
        .orderBy("bucket")
        .withColumn("bucket", frames.iso("bucket"))
    )


def _change_rows(data: Dataset) -> DataFrame:
    """Every policy version saved and value attested, renewed or revoked: its time, its
    kind of change and its client's region (null for a client the dataset lacks), picked
    from both tables once and kept by a warm session."""

    def build() -> DataFrame:
        policies = data.table("policy_versions").select(
            F.col("created_at").alias("at"), "client_id", F.lit("policy").alias("change")
        )
        history = data.table("attribute_history")
        attested = (F.col("source") == "authority") & F.col("kind").isin("set", "renewed")
        values = history.where(attested | (F.col("kind") == "revoked")).select(
            "at", "client_id", F.when(attested, "attested").otherwise("revoked").alias("change")
        )
        regions = frames.every_receiver(data).select(
            F.col("receiver_id").alias("client_id"), "region"
        )
        changes = policies.unionByName(values)
        return changes.join(F.broadcast(regions), "client_id", "left").drop("client_id")

    sources = ("policy_versions", "attribute_history", "clients")
    return data.derived("changes of policies and values", sources, build)
