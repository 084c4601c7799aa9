"""Audit review: who did what, the refusals by reason per actor and per policy, and the
anomalies worth a look, over the audit entries (and the events) of the window.

Sections
- `activity`: per actor and group of actions (ACTION_GROUPS), what was done and what
  was refused, first and last time. Sends are counted from the events table (every
  event, by whoever published it: an agent, or an operator acting for its sender),
  since the audit log records only operators' sends; an operator's send confirmed by
  typing its count is also a `send confirmation`.
- `refusals`: per actor and category (broker.audit's REFUSAL_CATEGORIES), the entries,
  the receivers that refused (a leaf's policy refusal counts its refusers; other
  entries none), the events concerned, first and last time.
- `refusals_by_policy`: the leaves' policy refusals by the refusing receiver's policy,
  as that receiver's latest policy version created before the window's end holds it.
  Attributed exactly: every receiver an entry lists (the first
  broker.audit.MAX_LISTED_NAMES of each), to the policy it held at the end of the window.
  Not attributed: the receivers an entry only counts (`refusers_unlisted` in the
  summary); the subtrees an inner dispatcher refused on its summary, which name no
  receiver (`subtree_refusals`); and a receiver whose policy changed during the window
  is put under its latest policy, not the one that refused.
- `anomalies`: `refusals_jump`, an actor whose refusals in the window's last quarter
  exceed JUMP_FACTOR times its rate per quarter before (and are at least
  JUMP_MIN_RECENT); `policy_refuses_all`, a policy whose receivers were named in policy
  refusals in the window and got no delivery in it: it refused every sender that
  addressed them and accepted none.

Region: with `params.region`, an entry counts when a client of that region is involved:
its actor, its target (`client:NAME`), or a client it lists (a policy refusal's
receivers, a bulk change's clients); a send when its sender is of the region. Refusals
by policy and `refusers` count only the region's listed receivers; `policy_refuses_all`
looks at the region's receivers only.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import datetime

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from broker import audit
from reports.jobs.frames import (
    at_or_after,
    before,
    count_where,
    deliveries_to_receivers,
    in_window,
    iso,
    rows,
)
from reports.results import Field, Params, Result, Section
from reports.spark import Dataset

MAX_ACTIVITY_ROWS = 500
MAX_REFUSAL_ROWS = 500
MAX_POLICY_ROWS = 100
MAX_ANOMALIES = 100
POLICY_TEXT_SHOWN = 300  # characters of a policy's canonical text in a row

# A jump: the last quarter's refusals are more than JUMP_FACTOR times the actor's
# average per quarter in the three before (any at all, when it had none before) and
# at least JUMP_MIN_RECENT, so that two refusals after one are not called a jump.
JUMP_FACTOR = 3.0
JUMP_MIN_RECENT = 5

ACTION_GROUPS = {
    "event.publish": "send",
    "event.send": "send",
    "event.resend": "send",
    "event.refused_by_policy": "send",
    "delivery.confirm": "delivery answer",
    "delivery.ack": "delivery answer",
    "policy.set": "policy edit",
    "attributes.attest": "attestation",
    "attributes.renew": "attestation",
    "attributes.revoke": "revocation",
    "grant.revoke": "revocation",
    "grant.create": "grant",
    "client.issue_token": "token issue",
    "client.issue_fleet_tokens": "token issue",
    "operator.issue_token": "token issue",
    "client.revoke_tokens": "token revocation",
    "attributes.state": "attributes stated",
    "attributes.advertise": "attributes stated",
}
OTHER_GROUP = "other"
SEND_CONFIRMATION = "send confirmation"
POLICY_REFUSAL = "event.refused_by_policy"
DONE, REFUSED = "done", "refused"
NO_POLICY = "(no policy recorded)"

# What the jobs read of an entry's details: the names it lists and how many it does not.
LISTED = T.StructType([
    T.StructField("names", T.ArrayType(T.StringType())),
    T.StructField("unlisted", T.LongType()),
])  # fmt: skip
DETAILS = T.StructType([
    T.StructField("receivers", LISTED),
    T.StructField("clients", LISTED),
    T.StructField("refusers", T.LongType()),
    T.StructField("subtrees", T.LongType()),
    T.StructField("confirmed_count", T.LongType()),
])  # fmt: skip

SECTIONS: dict[str, Section] = {
    "activity": Section(
        "Who did what",
        (
            Field("actor", "Actor"),
            Field("group", "Actions"),
            Field("done", "Done", "int"),
            Field("refused", "Refused", "int"),
            Field("first", "First", "time"),
            Field("last", "Last", "time"),
        ),
    ),
    "refusals": Section(
        "Refusals by reason",
        (
            Field("actor", "Actor"),
            Field("category", "Reason"),
            Field("entries", "Entries", "int"),
            Field("refusers", "Receivers refusing", "int"),
            Field("events", "Events", "int"),
            Field("first", "First", "time"),
            Field("last", "Last", "time"),
        ),
    ),
    "refusals_by_policy": Section(
        "Refusals by the refusing receivers' policy",
        (
            Field("policy", "Policy"),
            Field("holders", "Receivers holding it", "int"),
            Field("receivers", "Receivers refusing", "int"),
            Field("refusals", "Refusals", "int"),
            Field(audit.SENDER_NOT_QUALIFIED, "Sender not qualified", "int"),
            Field(audit.CONTENT_FILTERED, "Content filtered", "int"),
            Field("senders", "Senders refused", "int"),
        ),
    ),
    "anomalies": Section(
        "Worth a look",
        (
            Field("kind", "Kind"),
            Field("subject", "Actor or policy"),
            Field("recent", "Refusals (last quarter, or in the window)", "int"),
            Field("baseline", "Refusals per quarter before", "float"),
            Field("ratio", "Ratio", "float"),
            Field("senders", "Senders refused", "int"),
            Field("holders", "Receivers holding the policy", "int"),
            Field("deliveries", "Deliveries to them", "int"),
            Field("detail", "In words"),
        ),
    ),
}


def run(data: Dataset, params: Params) -> Result:
    """The audit review over the window (see the module's docstring)."""
    with ExitStack() as kept:
        refused = kept.enter_context(_persisted(_entries(data, params, refused_only=True)))
        policies = kept.enter_context(_persisted(_latest_policies(data, params)))
        acts = kept.enter_context(_persisted(_acts(data, params)))
        # Both small (a row per refusing actor and reason, per refusing policy), each
        # read by several sections: collected once, and those sections read them here
        # rather than asking Spark a query each (0.1 to 0.2 s apiece when warm).
        by_actor = rows(_refusals_by_actor(refused, params), REFUSAL_FIGURES)
        by_policy = rows(_refusals_by_policy(refused, policies, data), POLICY_FIGURES)
        sections = {
            "activity": _activity(acts),
            "refusals": _refusal_rows(by_actor),
            "refusals_by_policy": _policy_rows(by_policy),
            "anomalies": _jumps(by_actor) + _refusing_all(by_policy, data, params, policies),
        }
        summary = _summary(acts, by_actor, sections)
    return Result(summary=summary, sections=sections)


@contextmanager
def _persisted(frame: DataFrame) -> Iterator[DataFrame]:
    """`frame` computed once for the several reads of a run, then let go."""
    frame = frame.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        yield frame
    finally:
        frame.unpersist()


# The window's entries ------------------------------------------------------------------


def _entries(data: Dataset, params: Params, *, refused_only: bool) -> DataFrame:
    """The window's entries (or only its refusals), with what their details say (see
    _with_details); with a region, only those involving its clients."""
    found = entries_read(data).where(in_window("at", params))
    if refused_only:
        found = found.where(F.col("outcome") == REFUSED)
    if params.region:
        found = _involving_region(found, params.region)
    return found.drop("id", "named", "actor_region", "target_region", "named_regions")


def keep(data: Dataset) -> None:
    """Keep what this report reads beyond the tables (a warm session's start-up)."""
    for kept in (entries_read, _dated_versions, _policy_texts):
        kept(data)


def entries_read(data: Dataset) -> DataFrame:
    """Every entry with what its details say (_with_details), its group of actions
    (_group), the regions of its actor and target (`actor_region`, `target_region`),
    and the clients it lists with their regions (see _with_named).
    Read once and kept by a warm session (an export's new entries are read alone), so
    that a run parses no details and joins no clients."""
    return data.derived_rows(
        "audit entries read", "audit", ("clients",), lambda found: _read(data, found)
    )


def _read(data: Dataset, found: DataFrame) -> DataFrame:
    entries = _with_details(found)
    regions = data.table("clients").select(F.col("name").alias("client"), "region")
    involved = (
        entries.join(F.broadcast(_renamed(regions, "actor")), "actor_client", "left")
        .join(F.broadcast(_renamed(regions, "target")), "target_client", "left")
        .withColumn("group", _group())
        .drop("actor_client", "target_client")
    )
    return _with_named(involved, regions).drop("bulk")


def _with_named(entries: DataFrame, regions: DataFrame) -> DataFrame:
    """`entries` with the clients each lists (`named`: each name, its region, whether
    it is a listed receiver) and their regions (`named_regions`), both null where it
    lists none. Only the few entries that list clients are joined with their names, and
    only they carry arrays: a join of every entry sorted them all by id, and arrays
    built on each (by lambdas, which Spark runs row by row) weighed on keeping them
    (9,661,810 entries kept in 34 s, against 52 with both)."""
    lists = F.col("listed").isNotNull() | F.col("bulk").isNotNull()
    listing = entries.where(lists)
    named = (
        listing.join(_named(listing, regions), "id", "left")
        .withColumn("named", F.coalesce("named", F.array().cast(NAMED)))
        .withColumn("named_regions", F.transform("named", lambda n: n["region"]))
    )
    return named.unionByName(entries.where(~lists), allowMissingColumns=True)


NAMED = "array<struct<client:string,region:string,listed:boolean>>"


def _renamed(regions: DataFrame, role: str) -> DataFrame:
    return regions.select(
        F.col("client").alias(f"{role}_client"), F.col("region").alias(f"{role}_region")
    )


def _named(entries: DataFrame, regions: DataFrame) -> DataFrame:
    """Per entry listing clients (policy refusals, bulk changes): each name it lists,
    with its region and whether it is a listed receiver."""
    empty = F.array().cast("array<struct<client:string,listed:boolean>>")
    names = F.concat(
        F.coalesce(F.transform("listed", lambda name: _name(name, listed=True)), empty),
        F.coalesce(F.transform("bulk", lambda name: _name(name)), empty),
    )
    spread = entries.select("id", F.explode(names).alias("n")).select("id", "n.client", "n.listed")
    return (
        spread.join(F.broadcast(regions), "client", "left")
        .groupBy("id")
        .agg(F.collect_list(F.struct("client", "region", "listed")).alias("named"))
    )


def _name(name: Column, *, listed: bool = False) -> Column:
    return F.struct(name.alias("client"), F.lit(listed).alias("listed"))


def _with_details(found: DataFrame) -> DataFrame:
    """Entries with their details read once: whether a send was confirmed, the
    clients involved (actor, target, listed; a bulk change's clients when `bulk`),
    the refusers and the receivers not listed. Details are parsed only where they say
    something a section reads, and Spark evaluates only what a section goes on to read."""
    action = F.col("action")
    confirmed = F.get_json_object("details", "$.confirmed_count").isNotNull()
    clients = _bulk_clients()
    parsed = found.select(
        "id", "at", "actor", "action", "outcome", "target",
        F.coalesce("category", F.lit(audit.OTHER)).alias("category"),
        F.when(action == POLICY_REFUSAL, F.from_json("details", DETAILS)).alias("d"),
        F.when(action == "event.send", confirmed).otherwise(False).alias("confirmed"),
        F.from_json(clients, T.ArrayType(T.StringType())).alias("bulk"),
    )  # fmt: skip
    return parsed.select(
        "id", "at", "actor", "action", "outcome", "target", "category", "confirmed", "bulk",
        _client_name("actor").alias("actor_client"),
        _client_name("target").alias("target_client"),
        F.col("d.receivers.names").alias("listed"),
        F.coalesce("d.receivers.unlisted", F.lit(0)).alias("unlisted"),
        F.coalesce("d.refusers", F.lit(0)).alias("refusers"),
        F.col("d.subtrees").isNotNull().alias("in_subtrees"),
    )  # fmt: skip


def _bulk_clients() -> Column:
    """The names a bulk change lists (JSON text), parsed only in details whose text
    holds the key: most entries (answers) hold no list, and a text search costs far
    less than a JSON parse. (Details are PostgreSQL's jsonb as text: keys unescaped.)"""
    may_list = F.col("details").contains('"clients"')
    return F.when(may_list, F.get_json_object("details", "$.clients.names"))


def _client_name(column: str) -> Column:
    """The client an actor or target (`client:NAME`) names, else null."""
    value = F.col(column)
    return F.when(value.startswith("client:"), F.substring_index(value, ":", -1))


def _region_clients(data: Dataset, region: str) -> DataFrame:
    return (
        data.table("clients")
        .where(F.col("region") == region)
        .select(F.col("id").alias("client_id"), F.col("name").alias("client"))
    )


def _involving_region(entries: DataFrame, region: str) -> DataFrame:
    """The entries a client of the region is involved in (its actor, target, or a
    client it lists); a policy refusal's listed receivers (and so its refusers)
    narrowed to the region's."""
    here = F.lit(region)
    involved = (
        (F.col("actor_region") == here)
        | (F.col("target_region") == here)
        | F.array_contains("named_regions", here)
    )
    listed_here = F.filter("named", lambda n: n["listed"] & (n["region"] == here))
    listed = F.when(F.col("listed").isNotNull(), F.transform(listed_here, lambda n: n["client"]))
    return (
        entries.where(involved)
        .withColumns({"listed": listed, "unlisted": F.lit(0).cast("long")})
        .withColumn(
            "refusers",
            F.when(F.col("listed").isNotNull(), F.size("listed")).otherwise(0).cast("long"),
        )
    )


# Activity ------------------------------------------------------------------------------


def _acts(data: Dataset, params: Params) -> DataFrame:
    """Per actor and group of actions: what was done and refused, first and last time,
    with the window's sends (from the events) among them; and the audit entries and
    changes (done) counted there, for the summary (group null: an operator's
    unconfirmed send, see _group). One aggregation of the window's entries."""
    entries = _entries(data, params, refused_only=False).select(
        "actor", "group", "outcome", "at", F.lit(1).alias("audited")
    )
    outcome, audited = F.col("outcome"), F.col("audited") == 1
    return (
        entries.unionByName(_sends(data, params))
        .groupBy("actor", "group")
        .agg(
            count_where(outcome == DONE).alias("done"),
            count_where(outcome == REFUSED).alias("refused"),
            F.min("at").alias("first_at"),
            F.max("at").alias("last_at"),
            count_where(audited).alias("entries"),
            count_where(audited & (outcome == DONE)).alias("changes"),
        )
    )


def _activity(acts: DataFrame) -> list[dict]:
    ordered = (
        acts.where(F.col("group").isNotNull())
        .orderBy(F.desc(F.col("done") + F.col("refused")), "actor", "group")
        .withColumns({"first": iso("first_at"), "last": iso("last_at")})
    )
    return rows(ordered, SECTIONS["activity"].field_names, limit=MAX_ACTIVITY_ROWS)


def _group() -> Column:
    """An entry's group of actions. An operator's send is counted from the events, so
    its entry counts only as a confirmation, when it was confirmed."""
    action, done = F.col("action"), F.col("outcome") == DONE
    mapping = F.create_map(*[F.lit(x) for pair in ACTION_GROUPS.items() for x in pair])
    return (
        F.when((action == "event.send") & done & F.col("confirmed"), F.lit(SEND_CONFIRMATION))
        .when((action == "event.send") & done, F.lit(None))
        .otherwise(F.coalesce(mapping[action], F.lit(OTHER_GROUP)))
    )


def _sends(data: Dataset, params: Params) -> DataFrame:
    """Every event published in the window, as a send done by whoever published it."""
    events = data.table("events").where(in_window("published_at", params))
    if params.region:
        senders = F.broadcast(_region_clients(data, params.region)).select(
            F.col("client_id").alias("sender_id")
        )
        events = events.join(senders, "sender_id", "left_semi")
    by = F.when(F.coalesce("sent_by", F.lit("")) == "", F.concat(F.lit("client:"), "sender"))
    return events.select(
        by.otherwise(F.col("sent_by")).alias("actor"),
        F.lit("send").alias("group"),
        F.lit(DONE).alias("outcome"),
        F.col("published_at").alias("at"),
        F.lit(0).alias("audited"),
    )


# Refusals ------------------------------------------------------------------------------


def _refusals_by_actor(refused: DataFrame, params: Params) -> DataFrame:
    """Per actor and category: the entries (and how many in the window's last
    quarter), refusers, events, first and last; the unlisted refusers and the subtrees'
    refusals of policy refusals."""
    recent = at_or_after("at", _last_quarter(params))
    policy_refusal = F.col("action") == POLICY_REFUSAL
    event = F.when(F.col("target").startswith("event:"), F.col("target"))
    return (
        refused.groupBy("actor", "category")
        .agg(
            F.count(F.lit(1)).alias("entries"),
            F.sum("refusers").cast("long").alias("refusers"),
            F.count_distinct(event).alias("events"),
            F.min("at").alias("first_at"),
            F.max("at").alias("last_at"),
            F.sum(recent.cast("long")).alias("recent"),
            F.sum(F.when(policy_refusal, F.col("unlisted"))).cast("long").alias("unlisted"),
            F.sum((policy_refusal & F.col("in_subtrees")).cast("long")).alias("subtree_refusals"),
        )
        .withColumns({"first": iso("first_at"), "last": iso("last_at")})
    )


REFUSAL_FIGURES = [
    "actor", "category", "entries", "refusers", "events", "first", "last",
    "recent", "unlisted", "subtree_refusals",
]  # fmt: skip


def _refusal_rows(by_actor: list[dict]) -> list[dict]:
    ordered = sorted(by_actor, key=lambda row: (-row["entries"], *_texts(row, "actor", "category")))
    fields = SECTIONS["refusals"].field_names
    return [{name: row[name] for name in fields} for row in ordered[:MAX_REFUSAL_ROWS]]


def _texts(row: dict, *names: str) -> tuple:
    """A sort key of the row's text columns `names`, nulls first, as Spark orders them
    (UTF-8 bytes order as code points do)."""
    return tuple((row[name] is not None, row[name] or "") for name in names)


def _latest_policies(data: Dataset, params: Params) -> DataFrame:
    """Per receiver, its latest policy version created before the window's end: its
    id, name, policy (`policy_key`, a 64-bit hash of its canonical text, moves through
    the joins instead of the text). A filter of the kept dated versions: no grouping."""
    end = params.window_end
    in_force = before("created_at", end) & (F.col("until").isNull() | at_or_after("until", end))
    policies = _dated_versions(data).where(in_force).select("client_id", "client", "policy_key")
    if params.region:
        region = _region_clients(data, params.region).select("client_id")
        policies = policies.join(F.broadcast(region), "client_id", "left_semi")
    return policies


def _dated_versions(data: Dataset) -> DataFrame:
    """Every policy version with its policy's key (a hash of its text: the text is not
    kept) and `until`: the earliest creation of a later version of its client (null
    when none). A version is the latest created before a moment when it was created
    before and `until` is not (exactly, even if a later version's clock ran behind).
    Kept: grouping 133,334 versions per client cost a shuffle at every run."""
    later = Window.partitionBy("client_id").orderBy("version")
    later = later.rowsBetween(1, Window.unboundedFollowing)

    def build() -> DataFrame:
        keyed = _keyed(data.table("policy_versions"))
        return keyed.withColumn("until", F.min("created_at").over(later))

    return data.derived("policy versions dated", ("policy_versions",), build)


def _keyed(versions: DataFrame) -> DataFrame:
    columns = ("id", "client_id", "client", "version", "created_at")
    return versions.select(*columns, F.xxhash64("policy").alias("policy_key"))


def _policy_texts(data: Dataset) -> DataFrame:
    """{policy_key: canonical text}: few rows, however many receivers hold them; kept."""

    def build() -> DataFrame:
        texts = data.table("policy_versions").select("policy").distinct()
        return texts.select(F.xxhash64("policy").alias("policy_key"), "policy")

    return data.derived("policy texts", ("policy_versions",), build)


def _refusals_by_policy(refused: DataFrame, policies: DataFrame, data: Dataset) -> DataFrame:
    """Per policy: its listed refusing receivers, refusals by category and senders;
    with how many receivers hold it (null key and text: receivers with no policy)."""
    named = refused.where(F.col("listed").isNotNull()).select(
        "actor", "category", F.explode("listed").alias("client")
    )
    held_by = F.broadcast(policies.select("client", "policy_key"))
    attributed = named.join(held_by, "client", "left")
    counts = [
        F.sum((F.col("category") == c).cast("long")).alias(c)
        for c in (audit.SENDER_NOT_QUALIFIED, audit.CONTENT_FILTERED)
    ]
    refusing = attributed.groupBy("policy_key").agg(
        F.count_distinct("client").alias("receivers"),
        F.count(F.lit(1)).alias("refusals"),
        *counts,
        F.count_distinct("actor").alias("senders"),
    )
    held = policies.groupBy("policy_key").agg(F.count(F.lit(1)).alias("holders"))
    texts = F.broadcast(_policy_texts(data))
    return refusing.join(held, "policy_key", "left").join(texts, "policy_key", "left")


POLICY_FIGURES = [
    "policy_key", "policy", "holders", "receivers", "refusals",
    audit.SENDER_NOT_QUALIFIED, audit.CONTENT_FILTERED, "senders",
]  # fmt: skip


def _policy_rows(by_policy: list[dict]) -> list[dict]:
    return [_policy_row(row) for row in _by_refusals(by_policy)[:MAX_POLICY_ROWS]]


def _policy_row(row: dict) -> dict:
    shown = {name: row[name] for name in SECTIONS["refusals_by_policy"].field_names}
    return {**shown, "policy": _shown(row["policy"]), "holders": row["holders"] or 0}


def _by_refusals(by_policy: list[dict]) -> list[dict]:
    """The policies, most refusals first, then by their text."""
    return sorted(by_policy, key=lambda row: (-row["refusals"], *_texts(row, "policy")))


def _shown(policy: str | None) -> str:
    """A policy's text as a row shows it: cut at POLICY_TEXT_SHOWN characters."""
    if policy is None:
        return NO_POLICY
    if len(policy) > POLICY_TEXT_SHOWN:
        return policy[: POLICY_TEXT_SHOWN - 1] + "…"
    return policy


# Anomalies -----------------------------------------------------------------------------


def _last_quarter(params: Params) -> datetime:
    return params.window_end - (params.window_end - params.window_start) / 4


def _jumps(by_actor: list[dict]) -> list[dict]:
    """Actors whose refusals jumped in the window's last quarter (see JUMP_FACTOR)."""
    recent: dict[str, int] = {}
    entries: dict[str, int] = {}
    for row in by_actor:
        recent[row["actor"]] = recent.get(row["actor"], 0) + row["recent"]
        entries[row["actor"]] = entries.get(row["actor"], 0) + row["entries"]
    jumped = []
    for actor, count in recent.items():
        baseline = (entries[actor] - count) / 3.0  # the three quarters before, on average
        if count >= JUMP_MIN_RECENT and count > baseline * JUMP_FACTOR:
            ratio = count / baseline if baseline > 0 else None
            jumped.append({"kind": "refusals_jump", "subject": actor, "recent": count,
                           "baseline": baseline, "ratio": ratio})  # fmt: skip
    jumped.sort(key=lambda row: (-row["recent"], *_texts(row, "subject")))
    return [_jump_row(row) for row in jumped[:MAX_ANOMALIES]]


def _jump_row(row: dict) -> dict:
    before = f"{row['baseline']:.1f} per quarter before" if row["baseline"] else "none before"
    return {
        **_blank_anomaly(),
        **row,
        "detail": f"{row['recent']} refusals in the window's last quarter, {before}",
    }


def _refusing_all(
    by_policy: list[dict], data: Dataset, params: Params, policies: DataFrame
) -> list[dict]:
    """Policies named in refusals whose receivers got no delivery in the window."""
    named = [row for row in by_policy if row["policy_key"] is not None]
    if not named:
        return []
    delivered = _delivered_policies(data, params, policies)
    found = [row for row in _by_refusals(named) if row["policy_key"] not in delivered]
    return [
        _refusing_all_row({
            "kind": "policy_refuses_all",
            "subject": _shown(row["policy"]),
            "recent": row["refusals"],
            "senders": row["senders"],
            "holders": row["holders"],
        })
        for row in found[:MAX_ANOMALIES]
    ]  # fmt: skip


def _delivered_policies(data: Dataset, params: Params, policies: DataFrame) -> set[int]:
    """The policies (keys) whose receivers got a delivery in the window: few, one per
    policy text. (Not narrowed to the refusing policies' keys by a filter: the keys
    written in a query would be compiled into its code again at every other set.)"""
    deliveries = deliveries_to_receivers(data).where(in_window("delivered_at", params))
    receivers = F.broadcast(policies.select(F.col("client_id").alias("receiver_id"), "policy_key"))
    found = deliveries.select("receiver_id").join(receivers, "receiver_id")
    return {row.policy_key for row in found.select("policy_key").distinct().collect()}


def _refusing_all_row(row: dict) -> dict:
    return {
        **_blank_anomaly(),
        **row,
        "deliveries": 0,
        "detail": f"refused {row['senders']} sender(s) {row['recent']} times and accepted "
        f"nothing: none of its {row['holders']} receivers got a delivery",
    }


def _blank_anomaly() -> dict:
    return dict.fromkeys(SECTIONS["anomalies"].field_names)


# Summary -------------------------------------------------------------------------------


def _summary(acts: DataFrame, by_actor: list[dict], sections: dict) -> dict:
    """Entries and changes; refusals per category, refusers not listed (so not
    attributed to a policy) and refusals of whole subtrees; anomalies."""
    counted = acts.agg(F.sum("entries").alias("entries"), F.sum("changes").alias("changes"))
    totals = counted.first()

    def total(name: str, category: str | None = None) -> int:
        return sum(row[name] or 0 for row in by_actor if category in (None, row["category"]))

    return {
        "entries": totals["entries"] or 0,
        "changes": totals["changes"] or 0,
        "refusals": total("entries"),
        **{category: total("entries", category) for category in audit.REFUSAL_CATEGORIES},
        "refusers_unlisted": total("unlisted"),
        "subtree_refusals": total("subtree_refusals"),
        "anomalies": len(sections["anomalies"]),
    }
