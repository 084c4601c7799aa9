"""The five reports in one process, with DuckDB over the same Parquet dataset: the
single-process baseline of the reports benchmark (bench/reports.py).

Each report is what `reports.jobs.<kind>.run` computes: the same sections, fields and
figures, over the same window and region, each incremental table read as its latest
row version per id (reports.spark.Dataset). It is written as the job is: what the job
caches is a temporary table here, what it recomputes is recomputed, and where the job
chose a method (sorted lists of delays for the reach's order statistics, each event's
hops side by side for the tree's hop latency) the baseline uses the same one, so that
the two differ by engine, not by algorithm. DuckDB uses every core.

The jobs' constants and their plain-Python shaping of rows (the tree's per-dispatcher
rows, the audit's anomaly wording) are imported from the jobs, never restated.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import duckdb

from broker import audit as broker_audit
from broker.models import Delivery
from broker.reads.progress import NO_REGION
from broker.services.tree import MAX_DEPTH
from reports.dataset import TABLES, Table, batches
from reports.jobs import KINDS, frames
from reports.jobs import audit as audit_job
from reports.jobs import latency as latency_job
from reports.jobs import reach as reach_job
from reports.jobs import timeline as timeline_job
from reports.jobs import tree as tree_job
from reports.results import Params, Result

State = Delivery.State
DUCK_TYPES = {
    "string": "VARCHAR",
    "int64": "BIGINT",
    "bool": "BOOLEAN",
    "timestamp[us, tz=UTC]": "TIMESTAMPTZ",
}
ISO_UTC = "%Y-%m-%dT%H:%M:%S.%fZ"  # frames.ISO_UTC, in strftime's words


def run_baseline(kind: str, dataset: Path, params: Params) -> int:
    """Run the report `kind` over the dataset at `dataset`; return its result rows."""
    result = baseline_result(kind, dataset, params)
    return sum(len(rows) for rows in result.sections.values())


def baseline_result(kind: str, dataset: Path, params: Params) -> Result:
    """The report `kind` (reports.jobs.KINDS) over the dataset, computed by DuckDB."""
    if kind not in KINDS:
        raise ValueError(f"no report {kind!r}; reports are {', '.join(KINDS)}")
    with Duck(Path(dataset)) as db:
        return REPORTS[kind](db, params)


# The dataset -----------------------------------------------------------------------------


class Duck:
    """One in-memory DuckDB connection over the dataset at `root`. Its tables become
    views on first use, as reports.spark.Dataset reads its frames: per id the latest
    row version only."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.connection = duckdb.connect()
        # Spark's session is in UTC and sorts nulls first going up, last going down.
        self.connection.execute("SET TimeZone = 'UTC'")
        self.connection.execute("SET default_null_order = 'nulls_first_on_asc_last_on_desc'")
        self._views: set[str] = set()

    def __enter__(self) -> Duck:
        return self

    def __exit__(self, *_) -> None:
        self.connection.close()

    def table(self, name: str) -> str:
        """The view of the table `name` (reports.dataset.TABLES), made once."""
        if name not in self._views:
            reading = _reading(TABLES[name], self.root / name)
            self.connection.execute(f"CREATE TEMP VIEW {name} AS {reading}")
            self._views.add(name)
        return name

    def keep(self, name: str, query: str) -> str:
        """Compute `query` once into a temporary table (where a job caches a frame)."""
        self.connection.execute(f"CREATE TEMP TABLE {name} AS {query}")
        return name

    def rows(self, query: str, fields: list[str], *, limit: int | None = None) -> list[dict]:
        """The query's rows (at most `limit`) as dicts of `fields`."""
        if limit is not None:
            query = f"{query} LIMIT {limit}"
        found = self.connection.execute(query)
        names = [column[0] for column in found.description]
        return [_pick(dict(zip(names, row, strict=True)), fields) for row in found.fetchall()]

    def first(self, query: str) -> dict:
        """The query's one row, as a dict."""
        found = self.connection.execute(query)
        names = [column[0] for column in found.description]
        return dict(zip(names, found.fetchone(), strict=True))


def _pick(row: dict, fields: list[str]) -> dict:
    return {name: row[name] for name in fields}


def _reading(table: Table, folder: Path) -> str:
    """The SELECT of a table's columns from its Parquet files (none: no rows)."""
    columns = ", ".join(_quoted(name) for name in table.column_names)
    files = _parquet_files(folder)
    if not files:
        typed = ", ".join(
            f"NULL::{DUCK_TYPES[str(c.type)]} AS {_quoted(c.name)}" for c in table.columns
        )
        return f"SELECT {typed} WHERE false"
    listed = ", ".join(_text(str(path)) for path in files)
    source = f"read_parquet([{listed}], hive_partitioning = true, union_by_name = true)"
    if table.incremental and len(batches(folder)) > 1:
        # A row changed after its first export is in several batches: the latest wins.
        return (
            f"SELECT {columns} FROM {source} "
            "QUALIFY row_number() OVER (PARTITION BY id ORDER BY txid DESC) = 1"
        )
    return f"SELECT {columns} FROM {source}"


def _parquet_files(folder: Path) -> list[Path]:
    """The table's Parquet files, skipping hidden folders and files (an export's scratch
    folder, a compaction's staging) as Spark's file listing does."""
    if not folder.is_dir():
        return []
    return sorted(
        path
        for path in folder.rglob("*.parquet")
        if not any(part.startswith((".", "_")) for part in path.relative_to(folder).parts)
    )


# SQL fragments shared by the reports -----------------------------------------------------


def _quoted(name: str) -> str:
    return f'"{name}"'


def _text(value: str) -> str:
    escaped = value.replace("'", "''")
    return f"'{escaped}'"


def _time(moment: datetime) -> str:
    # A naive time is the machine's local time, as PySpark takes it.
    return f"TIMESTAMPTZ '{moment.astimezone().isoformat()}'"


def _texts(values) -> str:
    return ", ".join(_text(str(value)) for value in values)


def _between(column: str, start: datetime, end: datetime) -> str:
    return f"{column} >= {_time(start)} AND {column} < {_time(end)}"


def _in_window(column: str, params: Params) -> str:
    return _between(column, params.window_start, params.window_end)


def _iso(expression: str) -> str:
    """A timestamp as ISO 8601 text in UTC, to the microsecond (frames.iso)."""
    return f"strftime({expression}, '{ISO_UTC}')"


def _micros_between(start: str, end: str) -> str:
    return f"(epoch_us({end}) - epoch_us({start}))"


def _seconds(micros: str) -> str:
    return f"({micros}) / {frames.MICROS}"


def _is_state(*states: str) -> str:
    return f"state IN ({_texts(states)})"


def _state_counts() -> str:
    """A delivery aggregate's counts, as the event page counts them (frames.state_counts)."""
    return ", ".join(
        [
            "count(*) AS targeted",
            f"count_if({_is_state(*frames.RECEIVED_STATES)}) AS delivered",
            f"count_if({_is_state(State.ACKED)}) AS acked_ok",
            f"count_if({_is_state(State.FAILED)}) AS failed",
            f"count_if({_is_state(*frames.WAITING_STATES)}) AS no_answer",
            f"count_if({_is_state(State.EXPIRED)}) AS expired",
        ]
    )


def _bucket(column: str, seconds: int) -> str:
    """The start of the `seconds`-long bucket a time is in, aligned on the epoch."""
    epoch = f"(epoch_us({column}) // 1000000)"
    return f"to_timestamp({epoch} - {epoch} % {seconds})"


def _case(column: str, mapping: dict[str, str]) -> str:
    """`mapping[column]`, else null."""
    whens = " ".join(f"WHEN {_text(key)} THEN {_text(value)}" for key, value in mapping.items())
    return f"CASE {column} {whens} END"


def _json_text(path: str) -> str:
    """An audit entry's detail at `path`, as Spark's get_json_object gives it."""
    return f"json_extract_string(details, '$.{path}')"


def _window_events(db: Duck, params: Params) -> str:
    """The events published in [window_start, window_end) (frames.window_events)."""
    return f"SELECT * FROM {db.table('events')} WHERE {_in_window('published_at', params)}"


def _receivers(db: Duck, params: Params) -> str:
    """Clients as receivers, only the region's when the run is for one (frames.receivers)."""
    region = f"coalesce(region, {_text(NO_REGION)})"
    query = (
        f"SELECT id AS receiver_id, name AS receiver, {region} AS region, "
        f"dispatcher_id AS receiver_dispatcher FROM {db.table('clients')}"
    )
    return f"{query} WHERE {region} = {_text(params.region)}" if params.region else query


def _window_deliveries(db: Duck, params: Params) -> str:
    """The deliveries of the window's events (by the publishing time each carries) to
    the run's receivers, with the receiver's name, region and leaf (what
    frames.deliveries_to_receivers holds, in the window and region)."""
    return (
        f"SELECT d.*, r.receiver, r.region, r.receiver_dispatcher "
        f"FROM {db.table('deliveries')} d "
        f"JOIN ({_receivers(db, params)}) r ON r.receiver_id = d.receiver_id "
        f"WHERE {_in_window('d.published_at', params)}"
    )


def _region_clients(db: Duck, region: str) -> str:
    """The clients whose region is `region` (as the audit and tree jobs read it)."""
    return (
        f"SELECT id AS client_id, name AS client FROM {db.table('clients')} "
        f"WHERE region = {_text(region)}"
    )


def _field_names(job, section: str) -> list[str]:
    return job.SECTIONS[section].field_names


# Timeline --------------------------------------------------------------------------------


def timeline(db: Duck, params: Params) -> Result:
    """reports.jobs.timeline: events over time, markers and changes."""
    bucket = timeline_job.bucket_seconds(params)
    events = db.keep("timeline_events", _events_with_deliveries(db, params))
    limit = timeline_job.MAX_ROWS
    sections = {
        "series": db.rows(
            _series(events, bucket), _field_names(timeline_job, "series"), limit=limit
        ),
        "senders": db.rows(_senders(events), _field_names(timeline_job, "senders"), limit=limit),
    }
    totals = db.first(f"SELECT count(*) AS events, sum(deliveries) AS deliveries FROM {events}")
    markers = _markers(db, params)
    sections["markers"] = db.rows(markers, _field_names(timeline_job, "markers"), limit=limit)
    changes = _changes(db, params, bucket)
    sections["changes"] = db.rows(changes, _field_names(timeline_job, "changes"), limit=limit)
    summary = {
        "bucket_s": bucket,
        "events": int(totals["events"]),
        "deliveries": int(totals["deliveries"] or 0),
        "markers": db.first(f"SELECT count(*) AS n FROM ({markers})")["n"],
        "rows_limit": limit,
        "region": params.region,
    }
    return Result(summary=summary, sections=sections)


def _events_with_deliveries(db: Duck, params: Params) -> str:
    """The window's events, each with its deliveries to the run's receivers (for one
    region, only the events that have some)."""
    join = "JOIN" if params.region else "LEFT JOIN"
    return (
        f"WITH counts AS (SELECT event_id, count(*) AS deliveries "
        f"FROM ({_window_deliveries(db, params)}) GROUP BY event_id) "
        f"SELECT e.id AS event_id, e.published_at, e.kind, e.sender, e.channel, "
        f"coalesce(c.deliveries, 0) AS deliveries "
        f"FROM ({_window_events(db, params)}) e {join} counts c ON c.event_id = e.id"
    )


def _series(events: str, bucket: int) -> str:
    grouped = (
        f"SELECT {_bucket('published_at', bucket)} AS bucket_at, kind, sender, channel, "
        f"count(*) AS events, sum(deliveries) AS deliveries FROM {events} GROUP BY ALL"
    )
    return (
        f"SELECT {_iso('bucket_at')} AS bucket, kind, sender, channel, events, deliveries "
        f"FROM ({grouped}) ORDER BY bucket_at, kind, sender, channel"
    )


def _senders(events: str) -> str:
    grouped = (
        f"SELECT sender, count(*) AS events, sum(deliveries) AS deliveries, "
        f"min(published_at) AS first_at, max(published_at) AS last_at FROM {events} "
        "GROUP BY sender"
    )
    return (
        f"SELECT sender, events, deliveries, {_iso('first_at')} AS first, "
        f"{_iso('last_at')} AS last FROM ({grouped}) "
        "ORDER BY deliveries DESC, events DESC, sender"
    )


AT = '"at"'  # a column named `at` (a keyword to DuckDB)


def _markers(db: Duck, params: Params) -> str:
    """The window's changes that mark the timeline (timeline.MARKER_TYPES), in time order."""
    entries = (
        f"SELECT * FROM {db.table('audit')} WHERE {_in_window(AT, params)} "
        f"AND outcome = 'done' AND action IN ({_texts(timeline_job.MARKER_TYPES)})"
    )
    if params.region:
        entries = _about_the_region(entries, db, params)
    return (
        f"SELECT {_iso('m.' + AT)} AS {AT}, {_case('action', timeline_job.MARKER_TYPES)} AS type, "
        f"action, actor, target, {_what()} AS what FROM ({entries}) m ORDER BY m.{AT}, m.id"
    )


def _about_the_region(entries: str, db: Duck, params: Params) -> str:
    """Entries about a client of the region, and those not about one client."""
    prefix = _text(timeline_job.CLIENT_TARGET)
    names = f"SELECT receiver FROM ({_receivers(db, params)})"
    about_one = f"string_split(target, {prefix})[-1] IN ({names})"
    return f"SELECT * FROM ({entries}) WHERE NOT starts_with(target, {prefix}) OR {about_one}"


def _what() -> str:
    """The gist of a marker, from its audit details."""
    sent = f"concat_ws(' ', 'as', {_json_text('as')}, 'to', {_json_text('accepting')})"
    return (
        f"CASE WHEN action = 'event.send' THEN {sent} || ' accepting' "
        f"WHEN action = 'policy.set' THEN 'version ' || {_json_text('version')} "
        f"WHEN action = 'attributes.attest' THEN 'attested ' || {_json_text('values')} "
        f"WHEN action = 'attributes.revoke' THEN 'revoked ' || {_json_text('names')} "
        f"WHEN starts_with(action, 'grant.') THEN 'authority ' || {_json_text('authority')} END"
    )


def _changes(db: Duck, params: Params, bucket: int) -> str:
    """Per bucket: policy versions saved, values attested or renewed, values revoked."""
    attested = "(source = 'authority' AND kind IN ('set', 'renewed'))"
    changes = (
        f"SELECT created_at AS {AT}, client_id, 'policy' AS change "
        f"FROM {db.table('policy_versions')} UNION ALL "
        f"SELECT {AT}, client_id, CASE WHEN {attested} THEN 'attested' ELSE 'revoked' END "
        f"FROM {db.table('attribute_history')} WHERE {attested} OR kind = 'revoked'"
    )
    kept = _in_window(AT, params)
    if params.region:
        kept += f" AND client_id IN (SELECT receiver_id FROM ({_receivers(db, params)}))"
    grouped = (
        f"SELECT {_bucket(AT, bucket)} AS bucket_at, "
        "count_if(change = 'policy') AS policy_versions, "
        "count_if(change = 'attested') AS attestations, "
        "count_if(change = 'revoked') AS revocations "
        f"FROM ({changes}) WHERE {kept} GROUP BY bucket_at"
    )
    return (
        f"SELECT {_iso('bucket_at')} AS bucket, policy_versions, attestations, revocations "
        f"FROM ({grouped}) ORDER BY bucket_at"
    )


# Reach -----------------------------------------------------------------------------------


COUNT_NAMES = ", ".join(reach_job.COUNT_NAMES)
TIME_NAMES = ", ".join(f"t{percent}_s" for percent in reach_job.PERCENTS)


def reach(db: Duck, params: Params) -> Result:
    """reports.jobs.reach: reach and containment per command, per region, and who
    never answered."""
    by_region = db.keep("reach_by_region", _tallies_by_region(db, params))
    by_event = _tallies_by_event(db, params, by_region)
    limit = reach_job.MAX_ROWS
    summary = _reach_summary(db, by_event, params)
    sections = {
        "commands": db.rows(by_event, _field_names(reach_job, "commands"), limit=limit),
        "regions": db.rows(
            _ordered_regions(by_region), _field_names(reach_job, "regions"), limit=limit
        ),
        "never_answered": db.rows(
            _never_answered(db, params), _field_names(reach_job, "never_answered"), limit=limit
        ),
    }
    return Result(summary=summary, sections=sections)


def _tallies_by_region(db: Duck, params: Params) -> str:
    """Counts per (event, region), and the delays of its ok acknowledgements (µs)."""
    delay = (
        f"CASE WHEN {_is_state(State.ACKED)} THEN {_micros_between('published_at', 'acked_at')} END"
    )
    delays = "coalesce(list(delay) FILTER (WHERE delay IS NOT NULL), []::BIGINT[])"
    return (
        f"SELECT event_id, published_at, region, {_state_counts()}, {delays} AS delays "
        f"FROM (SELECT *, {delay} AS delay FROM ({_window_deliveries(db, params)})) "
        "GROUP BY event_id, published_at, region"
    )


def _tallies_by_event(db: Duck, params: Params, by_region: str) -> str:
    """Every event of the window with its counts (0 for none) and its times to 50/90/99 %;
    for one region, only the events that reached it."""
    sums = ", ".join(f"sum({name}) AS {name}" for name in reach_job.COUNT_NAMES)
    counts = ", ".join(f"coalesce(t.{name}, 0) AS {name}" for name in reach_job.COUNT_NAMES)
    join = "JOIN" if params.region else "LEFT JOIN"
    joined = (
        f"WITH totals AS (SELECT event_id, {sums}, flatten(list(delays)) AS delays "
        f"FROM {by_region} GROUP BY event_id) "
        f"SELECT e.id AS event_id, e.published_at, e.sender, e.kind, e.action, e.selector, "
        f"{counts}, t.delays FROM ({_window_events(db, params)}) e {join} totals t "
        "ON t.event_id = e.id"
    )
    return (
        f"SELECT event_id AS event, {_iso('published_at')} AS published_at, sender, kind, "
        f"action, selector, {COUNT_NAMES}, {TIME_NAMES} FROM ({_with_times(joined)}) "
        "ORDER BY published_at, event"
    )


def _ordered_regions(by_region: str) -> str:
    return (
        f"SELECT event_id AS event, region, {COUNT_NAMES}, {TIME_NAMES} "
        f"FROM ({_with_times(f'SELECT * FROM {by_region}')}) "
        "ORDER BY published_at, event_id, region"
    )


def _with_times(tallies: str) -> str:
    """t50_s, t90_s, t99_s: seconds from publishing to the acknowledgement that brought
    acknowledged-ok to that share of those targeted (null if it never did)."""
    times = ", ".join(f"{_time_to(percent)} AS t{percent}_s" for percent in reach_job.PERCENTS)
    sorted_delays = "list_sort(coalesce(delays, []::BIGINT[])) AS delays"
    return f"SELECT *, {times} FROM (SELECT * REPLACE ({sorted_delays}) FROM ({tallies}))"


def _time_to(percent: int) -> str:
    # The k-th acknowledgement, k = ceil(percent% of targeted), in whole numbers.
    k = f"(({percent} * targeted + 99) // 100)::BIGINT"
    return f"CASE WHEN {k} >= 1 AND len(delays) >= {k} THEN {_seconds(f'delays[{k}]')} END"


def _never_answered(db: Duck, params: Params) -> str:
    """The receivers that never answered, by event then name."""
    return (
        f"SELECT event_id AS event, receiver, region, state, "
        f"{_iso('delivered_at')} AS delivered_at FROM ({_window_deliveries(db, params)}) w "
        f"WHERE {_is_state(*frames.NEVER_ANSWERED_STATES)} "
        "ORDER BY w.published_at, w.event_id, w.receiver"
    )


def _reach_summary(db: Duck, by_event: str, params: Params) -> dict:
    """Totals over every event of the window (the sections may be cut at MAX_ROWS)."""
    sums = ", ".join(f"sum({name}) AS {name}" for name in reach_job.COUNT_NAMES)
    totals = db.first(f"SELECT count(*) AS events, {sums} FROM ({by_event})")
    summary = {name: int(value or 0) for name, value in totals.items()}
    summary["never_answered"] = summary["no_answer"] + summary["expired"]
    summary["rows_limit"] = reach_job.MAX_ROWS
    summary["region"] = params.region
    return summary


# Latency ---------------------------------------------------------------------------------


def latency(db: Duck, params: Params) -> Result:
    """reports.jobs.latency: delivery and acknowledgement latency percentiles per hop
    count, per region and overall."""
    deliveries = db.keep("latency_deliveries", _with_hops(db, params))
    figures = db.rows(_figures_by_group(deliveries), ["grouping", *LATENCY_KEYS, *FIGURE_NAMES])
    sections = {name: _section_rows(figures, key) for name, key in latency_job.GROUPINGS.items()}
    overall = sections["overall"][0] if sections["overall"] else {}
    summary = {
        "deliveries": overall.get("delivery_count", 0),
        "acknowledged": overall.get("ack_count", 0),
        "percentiles": "exact",
        "region": params.region,
    }
    return Result(summary=summary, sections=sections)


def _with_hops(db: Duck, params: Params) -> str:
    """The window's deliveries with their delays (µs) and their hop count (0 when the
    sender or the receiver is on no leaf)."""
    clients = db.table("clients")
    return (
        f"WITH {_hops_between_leaves(db)} "
        "SELECT coalesce(p.hops, 0) AS hops, w.region, "
        f"{_micros_between('w.published_at', 'w.delivered_at')} AS delivery, "
        f"{_micros_between('w.published_at', 'w.acked_at')} AS ack "
        f"FROM ({_window_deliveries(db, params)}) w "
        f"LEFT JOIN {clients} s ON s.id = w.sender_id "
        "LEFT JOIN pairs p ON p.sender_dispatcher = s.dispatcher_id "
        "AND p.receiver_dispatcher = w.receiver_dispatcher"
    )


def _hops_between_leaves(db: Duck) -> str:
    """CTEs ending in `pairs` (sender_dispatcher, receiver_dispatcher, hops) for every
    pair of dispatchers holding clients: steps up to the nearest common ancestor and
    down, plus one; a dispatcher's path to the root is at most MAX_DEPTH long."""
    dispatchers, clients = db.table("dispatchers"), db.table("clients")
    return (
        "RECURSIVE ancestors(dispatcher, ancestor, up) AS ("
        f"SELECT id, id, 0 FROM {dispatchers} UNION ALL "
        f"SELECT a.dispatcher, d.parent_id, a.up + 1 FROM ancestors a "
        f"JOIN {dispatchers} d ON d.id = a.ancestor "
        f"WHERE d.parent_id IS NOT NULL AND a.up < {MAX_DEPTH - 1}), "
        f"leaves AS (SELECT DISTINCT dispatcher_id FROM {clients} "
        "WHERE dispatcher_id IS NOT NULL), "
        "paths AS (SELECT * FROM ancestors "
        "WHERE dispatcher IN (SELECT dispatcher_id FROM leaves)), "
        "pairs AS (SELECT s.dispatcher AS sender_dispatcher, r.dispatcher AS receiver_dispatcher, "
        "min(s.up + r.up) + 1 AS hops FROM paths s JOIN paths r ON r.ancestor = s.ancestor "
        "GROUP BY s.dispatcher, r.dispatcher)"
    )


LATENCY_KEYS = [column for column in latency_job.GROUPINGS.values() if column]
FIGURE_NAMES = [field.name for field in latency_job.FIGURES]


def _figures_by_group(deliveries: str) -> str:
    """Every grouping's counts and percentiles of both delays, in one pass; groups
    without values are left out."""
    figures = []
    for measure, _, _ in latency_job.MEASURES:
        figures.append(f"count({measure}) AS {measure}_count")
        for name, fraction in latency_job.PERCENTILES:
            exact = f"quantile_cont({measure}, {fraction})"
            figures.append(f"{_seconds(exact)} AS {measure}_{name}_s")
    keys = ", ".join(LATENCY_KEYS)
    sets = ", ".join(f"({column or ''})" for column in latency_job.GROUPINGS.values())
    counts = " + ".join(f"count({measure})" for measure, _, _ in latency_job.MEASURES)
    return (
        f'SELECT GROUPING({keys}) AS "grouping", {keys}, {", ".join(figures)} '
        f"FROM {deliveries} GROUP BY GROUPING SETS ({sets}) HAVING {counts} > 0 "
        f"ORDER BY {keys}"
    )


def _section_rows(figures: list[dict], key: str | None) -> list[dict]:
    """The rows of the grouping by `key` (None: everything), in the key's order."""
    grouping = _grouping_id(key)
    fields = [key, *FIGURE_NAMES] if key else FIGURE_NAMES
    return [_pick(row, fields) for row in figures if row["grouping"] == grouping]


def _grouping_id(key: str | None) -> int:
    """GROUPING(*LATENCY_KEYS) of the rows grouped by `key` alone: a bit set for each
    key not grouped by, the first key's the highest."""
    bits = len(LATENCY_KEYS)
    return sum(1 << (bits - 1 - i) for i, column in enumerate(LATENCY_KEYS) if column != key)


# Tree ------------------------------------------------------------------------------------


HOP_FIELDS = (
    "dispatcher_id",
    "parent_id",
    "depth",
    "direction",
    "at",
    "forwarded",
    "delivered",
    "wasted",
)
# For one hop `x` among its event's hops `hops`: the time of the hop before it
# (tree.PREVIOUS_AT).
PREVIOUS_AT = """
CASE WHEN x.direction = 'down' THEN
    list_max(list_transform(
        list_filter(hops, lambda y: y.dispatcher_id = x.parent_id AND y."at" <= x."at"),
        lambda y: y."at"))
ELSE
    list_max(list_transform(
        list_filter(hops, lambda y: y.direction = 'up' AND y.parent_id = x.dispatcher_id
                                    AND y."at" <= x."at"),
        lambda y: y."at"))
END
"""
TRAFFIC_COLUMNS = [
    "depth", "dispatcher_id", "grouping", "routed", "entered", "wasted", "delivered",
    "forwards", "latency_hops", "latency",
]  # fmt: skip


def tree(db: Duck, params: Params) -> Result:
    """reports.jobs.tree: routing per dispatcher and per level, summaries, hop latency."""
    traffic = db.rows(_traffic(_measured_hops(_window_hops(db, params))), TRAFFIC_COLUMNS)
    by_dispatcher = {row["dispatcher_id"]: row for row in traffic if row["grouping"] == 0}
    by_level = {row["depth"]: row for row in traffic if row["grouping"] == 1}
    total = next((row for row in traffic if row["grouping"] == 3), {})
    shown = (
        f"SELECT * FROM {db.table('dispatchers')} ORDER BY depth, name "
        f"LIMIT {tree_job.MAX_DISPATCHERS}"
    )
    found = db.rows(shown, TABLES["dispatchers"].column_names)
    dispatchers = [tree_job._dispatcher_row(d, by_dispatcher.get(d["id"], {})) for d in found]
    levels = tree_job._level_rows(dispatchers, by_level)
    return Result(
        summary=tree_job._summary(dispatchers, total),
        sections={"dispatchers": dispatchers, "levels": levels},
    )


def _window_hops(db: Duck, params: Params) -> str:
    """Hops in the window (of the region's senders' events), with their dispatcher's
    parent and depth."""
    kept = _in_window(f"h.{AT}", params)
    if params.region:
        senders = f"SELECT client_id FROM ({_region_clients(db, params.region)})"
        events = f"SELECT id FROM {db.table('events')} WHERE sender_id IN ({senders})"
        kept += f" AND h.event_id IN ({events})"
    return (
        f"SELECT h.event_id, h.dispatcher_id, t.parent_id, t.depth, h.direction, h.{AT}, "
        f"h.forwarded, h.delivered, h.wasted FROM {db.table('hops')} h "
        f"JOIN {db.table('dispatchers')} t ON t.id = h.dispatcher_id WHERE {kept}"
    )


def _measured_hops(hops: str) -> str:
    """Each hop with `latency_us` (null when not measured) and `entered` (1 for an
    event's first hop: up, with no hop below it), its event's hops side by side."""
    fields = ", ".join(f"'{name}': {_quoted(name)}" for name in HOP_FIELDS)
    measured = f"list_transform(hops, lambda x: struct_insert(x, previous_at := {PREVIOUS_AT}))"
    per_event = f"SELECT event_id, list({{{fields}}}) AS hops FROM ({hops}) GROUP BY event_id"
    return (
        f"SELECT *, {_micros_between('previous_at', AT)} AS latency_us, "
        "(direction = 'up' AND previous_at IS NULL)::BIGINT AS entered "
        f"FROM (SELECT unnest({measured}, max_depth := 2) FROM ({per_event}))"
    )


def _traffic(hops: str) -> str:
    """Traffic per dispatcher (grouping 0), per level (1) and overall (3), in one pass;
    hop latency's p50 and p95 exact (interpolated), in milliseconds."""
    fractions = ", ".join(str(fraction) for fraction in tree_job.PERCENTILES.values())
    latency = f"list_transform(quantile_cont(latency_us, [{fractions}]), lambda v: v / 1000.0)"
    return (
        'SELECT depth, dispatcher_id, GROUPING(depth, dispatcher_id) AS "grouping", '
        "count(*) AS routed, sum(entered) AS entered, sum(wasted) AS wasted, "
        "sum(delivered) AS delivered, sum(forwarded) AS forwards, "
        f"count(latency_us) AS latency_hops, {latency} AS latency "
        f"FROM ({hops}) GROUP BY ROLLUP (depth, dispatcher_id)"
    )


# Audit -----------------------------------------------------------------------------------


# What the audit job reads of a policy refusal's details (audit.DETAILS), as DuckDB's
# json_transform takes it.
DETAILS = (
    '{"receivers": {"names": ["VARCHAR"], "unlisted": "BIGINT"}, '
    '"refusers": "BIGINT", "subtrees": "BIGINT"}'
)
NO_NAMES = "[]::VARCHAR[]"
REFUSED = f"outcome = {_text(audit_job.REFUSED)}"
JUMP_FIELDS = ["kind", "subject", "recent", "baseline", "ratio"]
REFUSING_ALL_FIELDS = ["kind", "subject", "recent", "senders", "holders"]


def audit(db: Duck, params: Params) -> Result:
    """reports.jobs.audit: who did what, refusals by reason and by policy, anomalies."""
    entries = db.keep("audit_entries", _entries(db, params))
    policies = _latest_policies(db, params)
    by_policy = db.keep("audit_by_policy", _refusals_by_policy(entries, policies))
    sections = {
        "activity": _activity(db, params, entries),
        "refusals": _refusals(db, entries),
        "refusals_by_policy": _policy_rows(db, by_policy),
        "anomalies": _jumps(db, params, entries) + _refusing_all(db, params, by_policy, policies),
    }
    return Result(summary=_audit_summary(db, entries, sections), sections=sections)


def _entries(db: Duck, params: Params) -> str:
    """The window's entries, their details read once: the clients involved (actor,
    target, listed), refusers and what was not listed."""
    confirmed = f"{_json_text('confirmed_count')} IS NOT NULL"
    bulk = "json_transform(json_extract(details, '$.clients.names'), '[\"VARCHAR\"]')"
    parsed = (
        f"SELECT id, {AT}, actor, action, outcome, target, "
        f"coalesce(category, {_text(broker_audit.OTHER)}) AS category, "
        f"CASE WHEN action = {_text(audit_job.POLICY_REFUSAL)} "
        f"THEN json_transform(details, '{DETAILS}') END AS d, "
        f"CASE WHEN action = 'event.send' THEN {confirmed} ELSE false END AS confirmed, "
        f"{bulk if params.region else 'NULL::VARCHAR[]'} AS bulk "
        f"FROM {db.table('audit')} WHERE {_in_window(AT, params)}"
    )
    entries = (
        f"SELECT id, {AT}, actor, action, outcome, target, category, confirmed, bulk, "
        f"{_client_name('actor')} AS actor_client, {_client_name('target')} AS target_client, "
        "d.receivers.names AS listed, coalesce(d.receivers.unlisted, 0) AS unlisted, "
        "coalesce(d.refusers, 0) AS refusers, d.subtrees IS NOT NULL AS in_subtrees "
        f"FROM ({parsed})"
    )
    return _involving_region(entries, db, params.region) if params.region else entries


def _client_name(column: str) -> str:
    """The client an actor or target (`client:NAME`) names, else null."""
    return f"CASE WHEN starts_with({column}, 'client:') THEN string_split({column}, ':')[-1] END"


def _involving_region(entries: str, db: Duck, region: str) -> str:
    """The entries a client of the region is involved in; a policy refusal's listed
    receivers (and so its refusers) narrowed to the region's."""
    clients = f"SELECT client FROM ({_region_clients(db, region)})"
    named = (
        f"[actor_client, target_client] || coalesce(listed, {NO_NAMES}) "
        f"|| coalesce(bulk, {NO_NAMES})"
    )
    listed = f"CASE WHEN e.listed IS NOT NULL THEN coalesce(h.listed_here, {NO_NAMES}) END"
    return (
        f"WITH entries AS ({entries}), "
        f"involved AS (SELECT id FROM (SELECT id, unnest({named}) AS client FROM entries) "
        f"WHERE client IN ({clients})), "
        "listed_here AS (SELECT id, list(client) AS listed_here "
        "FROM (SELECT id, unnest(listed) AS client FROM entries) "
        f"WHERE client IN ({clients}) GROUP BY id), "
        f"narrowed AS (SELECT e.* REPLACE ({listed} AS listed, 0::BIGINT AS unlisted) "
        "FROM entries e LEFT JOIN listed_here h ON h.id = e.id "
        "WHERE e.id IN (SELECT id FROM involved)) "
        "SELECT * REPLACE "
        "((CASE WHEN listed IS NOT NULL THEN len(listed) ELSE 0 END)::BIGINT AS refusers) "
        "FROM narrowed"
    )


def _activity(db: Duck, params: Params, entries: str) -> list[dict]:
    acts = (
        f'SELECT actor, {_group()} AS "group", '
        f"(outcome = {_text(audit_job.DONE)})::BIGINT AS done, ({REFUSED})::BIGINT AS refused, "
        f"{AT} FROM {entries}"
    )
    counted = (
        f'SELECT * FROM ({acts}) WHERE "group" IS NOT NULL UNION ALL BY NAME {_sends(db, params)}'
    )
    grouped = (
        f'SELECT actor, "group", sum(done) AS done, sum(refused) AS refused, '
        f'min({AT}) AS first_at, max({AT}) AS last_at FROM ({counted}) GROUP BY actor, "group"'
    )
    ordered = (
        f'SELECT actor, "group", done, refused, {_iso("first_at")} AS first, '
        f'{_iso("last_at")} AS last FROM ({grouped}) ORDER BY done + refused DESC, actor, "group"'
    )
    fields = _field_names(audit_job, "activity")
    return db.rows(ordered, fields, limit=audit_job.MAX_ACTIVITY_ROWS)


def _group() -> str:
    """An entry's group of actions. An operator's send is counted from the events, so
    its entry counts only as a confirmation, when it was confirmed."""
    send = f"action = 'event.send' AND outcome = {_text(audit_job.DONE)}"
    group = _case("action", audit_job.ACTION_GROUPS)
    return (
        f"CASE WHEN {send} AND confirmed THEN {_text(audit_job.SEND_CONFIRMATION)} "
        f"WHEN {send} THEN NULL ELSE coalesce({group}, {_text(audit_job.OTHER_GROUP)}) END"
    )


def _sends(db: Duck, params: Params) -> str:
    """Every event published in the window, as a send by whoever published it."""
    kept = _in_window("published_at", params)
    if params.region:
        kept += f" AND sender_id IN (SELECT client_id FROM ({_region_clients(db, params.region)}))"
    actor = "CASE WHEN coalesce(sent_by, '') = '' THEN 'client:' || sender ELSE sent_by END"
    return (
        f"SELECT {actor} AS actor, 'send' AS \"group\", 1::BIGINT AS done, 0::BIGINT AS refused, "
        f"published_at AS {AT} FROM {db.table('events')} WHERE {kept}"
    )


def _refusals(db: Duck, entries: str) -> list[dict]:
    events = "count(DISTINCT CASE WHEN starts_with(target, 'event:') THEN target END)"
    grouped = (
        f"SELECT actor, category, count(*) AS entries, sum(refusers)::BIGINT AS refusers, "
        f"{events} AS events, min({AT}) AS first_at, max({AT}) AS last_at "
        f"FROM {entries} WHERE {REFUSED} GROUP BY actor, category"
    )
    ordered = (
        f"SELECT actor, category, entries, refusers, events, {_iso('first_at')} AS first, "
        f"{_iso('last_at')} AS last FROM ({grouped}) ORDER BY entries DESC, actor, category"
    )
    fields = _field_names(audit_job, "refusals")
    return db.rows(ordered, fields, limit=audit_job.MAX_REFUSAL_ROWS)


def _latest_policies(db: Duck, params: Params) -> str:
    """Per receiver, its latest policy version created before the window's end: its
    name, id and the policy (`policy_key` a short key of its text)."""
    latest = (
        "SELECT client_id, arg_max({'client': client, 'policy': policy}, version) AS v "
        f"FROM {db.table('policy_versions')} WHERE created_at < {_time(params.window_end)} "
        "GROUP BY client_id"
    )
    policies = (
        "SELECT client_id, v.client AS client, v.policy AS policy, "
        f"hash(v.policy) AS policy_key FROM ({latest})"
    )
    if params.region:
        region = f"SELECT client_id FROM ({_region_clients(db, params.region)})"
        policies += f" WHERE client_id IN ({region})"
    return policies


def _refusals_by_policy(entries: str, policies: str) -> str:
    """Per policy (key): its listed refusing receivers, refusals by category, senders
    and events; with how many receivers hold it."""
    named = (
        f"SELECT actor, target, category, unnest(listed) AS client FROM {entries} "
        f"WHERE {REFUSED} AND listed IS NOT NULL"
    )
    attributed = (
        f"SELECT n.*, p.policy_key FROM ({named}) n LEFT JOIN ({policies}) p ON p.client = n.client"
    )
    categories = ", ".join(
        f"count_if(category = {_text(name)}) AS {name}"
        for name in (broker_audit.SENDER_NOT_QUALIFIED, broker_audit.CONTENT_FILTERED)
    )
    refusing = (
        "SELECT policy_key, count(DISTINCT client) AS receivers, count(*) AS refusals, "
        f"{categories}, count(DISTINCT actor) AS senders, count(DISTINCT target) AS events "
        f"FROM ({attributed}) GROUP BY policy_key"
    )
    held = (
        "SELECT policy_key, count(*) AS holders, first(policy) AS policy "
        f"FROM ({policies}) GROUP BY policy_key"
    )
    return (
        f"SELECT r.*, h.holders, h.policy FROM ({refusing}) r "
        f"LEFT JOIN ({held}) h ON h.policy_key = r.policy_key"
    )


def _policy_rows(db: Duck, by_policy: str) -> list[dict]:
    query = (
        f"SELECT {_shown('b.policy')} AS policy, coalesce(b.holders, 0) AS holders, "
        "b.receivers, b.refusals, b.sender_not_qualified, b.content_filtered, b.senders, "
        f"b.events FROM {by_policy} b ORDER BY b.refusals DESC, b.policy"
    )
    fields = _field_names(audit_job, "refusals_by_policy")
    return db.rows(query, fields, limit=audit_job.MAX_POLICY_ROWS)


def _shown(policy: str) -> str:
    """A policy's text as a row shows it: cut at POLICY_TEXT_SHOWN characters."""
    limit = audit_job.POLICY_TEXT_SHOWN
    cut = (
        f"CASE WHEN length({policy}) > {limit} "
        f"THEN substring({policy}, 1, {limit - 1}) || '…' ELSE {policy} END"
    )
    return f"coalesce({cut}, {_text(audit_job.NO_POLICY)})"


def _jumps(db: Duck, params: Params, entries: str) -> list[dict]:
    """Actors whose refusals jumped in the window's last quarter (audit.JUMP_FACTOR)."""
    recent = f"{AT} >= {_time(audit_job._last_quarter(params))}"
    per_actor = (
        f"SELECT actor, sum(({recent})::BIGINT) AS recent, "
        f"sum((NOT ({recent}))::BIGINT) AS earlier FROM {entries} WHERE {REFUSED} GROUP BY actor"
    )
    baseline = "(earlier / 3.0)"  # the three quarters before, on average
    jumped = (
        f"SELECT 'refusals_jump' AS kind, actor AS subject, recent, {baseline} AS baseline, "
        f"CASE WHEN {baseline} > 0 THEN recent / {baseline} END AS ratio FROM ({per_actor}) "
        f"WHERE recent >= {audit_job.JUMP_MIN_RECENT} "
        f"AND recent > {baseline} * {audit_job.JUMP_FACTOR} ORDER BY recent DESC, subject"
    )
    found = db.rows(jumped, JUMP_FIELDS, limit=audit_job.MAX_ANOMALIES)
    return [audit_job._jump_row(row) for row in found]


def _refusing_all(db: Duck, params: Params, by_policy: str, policies: str) -> list[dict]:
    """Policies named in refusals whose receivers got no delivery in the window."""
    delivered = (
        f"SELECT DISTINCT p.policy_key FROM {db.table('deliveries')} d "
        f"JOIN ({policies}) p ON p.client_id = d.receiver_id "
        f"WHERE {_in_window('d.delivered_at', params)}"
    )
    found = (
        f"SELECT 'policy_refuses_all' AS kind, {_shown('b.policy')} AS subject, "
        "b.refusals AS recent, b.senders, b.holders "
        f"FROM {by_policy} b WHERE b.policy_key IS NOT NULL "
        f"AND b.policy_key NOT IN ({delivered}) ORDER BY b.refusals DESC, b.policy"
    )
    rows = db.rows(found, REFUSING_ALL_FIELDS, limit=audit_job.MAX_ANOMALIES)
    return [audit_job._refusing_all_row(row) for row in rows]


def _audit_summary(db: Duck, entries: str, sections: dict[str, list[dict]]) -> dict:
    policy_refusal = f"({REFUSED} AND action = {_text(audit_job.POLICY_REFUSAL)})"
    categories = ", ".join(
        f"sum(({REFUSED} AND category = {_text(name)})::BIGINT) AS {_quoted(name)}"
        for name in broker_audit.REFUSAL_CATEGORIES
    )
    totals = db.first(
        f"SELECT count(*) AS entries, sum((NOT ({REFUSED}))::BIGINT) AS changes, "
        f"sum(({REFUSED})::BIGINT) AS refusals, {categories}, "
        f"sum(CASE WHEN {policy_refusal} THEN unlisted END) AS refusers_unlisted, "
        f"sum(({policy_refusal} AND in_subtrees)::BIGINT) AS subtree_refusals FROM {entries}"
    )
    summary = {name: value or 0 for name, value in totals.items()}
    summary["anomalies"] = len(sections["anomalies"])
    return summary


REPORTS: dict[str, Callable[[Duck, Params], Result]] = {
    "timeline": timeline,
    "reach": reach,
    "audit": audit,
    "tree": tree,
    "latency": latency,
}
