"""The Parquet dataset the reports read: which tables, which columns, and how each is
read from PostgreSQL. The one place these columns are defined (docs/reports.md).

Incremental tables are read by `txid` (the transaction that last wrote a row) between
two watermarks; snapshot tables are read whole. Times leave PostgreSQL as microseconds
since the epoch (no time zone or locale can change them) and become UTC timestamps.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

TIME = pa.timestamp("us", tz="UTC")
# The dataset's layout: raised when a table gains, loses or changes a column, so that
# an export finding a dataset of another layout writes it again from the start
# (reports.export) instead of mixing files of two layouts.
LAYOUT = 2
LAYOUT_FILE = "layout"  # in the dataset's folder: the LAYOUT it was written in


@dataclass(frozen=True)
class Column:
    """One column: its name and type in the dataset, and the SQL that reads it."""

    name: str
    type: pa.DataType
    sql: str

    @property
    def is_time(self) -> bool:
        return self.type == TIME


@dataclass(frozen=True)
class Table:
    """One table of the dataset. `source` is the FROM clause and `kept` the condition
    on its rows (default: all); an incremental table has a `txid` column and is read
    between watermarks."""

    name: str
    source: str
    columns: tuple[Column, ...]
    incremental: bool
    kept: str = "true"

    @property
    def schema(self) -> pa.Schema:
        return pa.schema([(c.name, c.type) for c in self.columns])

    @property
    def column_names(self) -> list[str]:
        return [c.name for c in self.columns]


def _micros(expression: str) -> str:
    return f"(extract(epoch from {expression}) * 1000000)::bigint"


def text(name: str, sql: str | None = None) -> Column:
    return Column(name, pa.string(), sql or name)


def integer(name: str, sql: str | None = None) -> Column:
    return Column(name, pa.int64(), sql or name)


def time(name: str, sql: str | None = None) -> Column:
    return Column(name, TIME, _micros(sql or name))


def flag(name: str, sql: str | None = None) -> Column:
    return Column(name, pa.bool_(), sql or name)


EVENTS = Table(
    "events",
    "broker_event e JOIN broker_client s ON s.id = e.sender_id",
    (
        text("id", "e.id::text"),
        integer("sender_id", "e.sender_id"),
        text("sender", "s.name"),
        text("channel", "e.channel"),
        integer("sequence", "e.sequence"),
        text("kind", "e.content->>'kind'"),
        text("action", "e.content->>'action'"),
        text("selector", "e.selector"),
        text("sent_by", "e.sent_by"),
        text("resend_of", "e.resend_of_id::text"),
        time("published_at", "e.published_at"),
        time("expires_at", "e.expires_at"),
        time("routed_at", "e.routed_at"),
        integer("lifetime_s", "e.lifetime_s"),
        integer("txid", "e.txid"),
    ),
    incremental=True,
)

# A delivery carries its event's publishing time (it never changes): a report's window
# selects deliveries by it without joining each delivery with its event on the event's
# id (text), the costliest step of a report per delivery.
DELIVERIES = Table(
    "deliveries",
    "broker_delivery d JOIN broker_event e ON e.id = d.event_id",
    (
        integer("id", "d.id"),
        text("event_id", "d.event_id::text"),
        time("published_at", "e.published_at"),
        integer("receiver_id", "d.receiver_id"),
        integer("sender_id", "d.sender_id"),
        text("state", "d.state"),
        time("delivered_at", "d.delivered_at"),
        time("received_at", "d.received_at"),
        time("acked_at", "d.acked_at"),
        text("failure", "CASE WHEN d.state = 'failed' THEN d.result::text END"),
        integer("txid", "d.txid"),
    ),
    incremental=True,
)

HOPS = Table(
    "hops",
    "broker_trafficrecord h",
    (
        integer("id", "h.id"),
        text("event_id", "h.event_id::text"),
        integer("dispatcher_id", "h.dispatcher_id"),
        text("direction", "h.direction"),
        integer("forwarded", "jsonb_array_length(h.forwarded_to)"),
        integer("delivered", "h.delivered"),
        integer("wasted", "h.wasted"),
        time("at", "h.at"),
        integer("txid", "h.txid"),
    ),
    incremental=True,
)

AUDIT = Table(
    "audit",
    "broker_auditentry a",
    (
        integer("id", "a.id"),
        time("at", "a.at"),
        text("actor", "a.actor"),
        text("action", "a.action"),
        text("target", "a.target"),
        text("outcome", "a.outcome"),
        text("reason", "a.reason"),
        text("category", "a.details->>'category'"),
        text("details", "a.details::text"),
        integer("txid", "a.txid"),
    ),
    incremental=True,
)

POLICY_VERSIONS = Table(
    "policy_versions",
    "broker_policyversion p JOIN broker_client c ON c.id = p.client_id",
    (
        integer("id", "p.id"),
        integer("client_id", "p.client_id"),
        text("client", "c.name"),
        integer("version", "p.version"),
        text("policy", "p.canonical_text"),
        time("created_at", "p.created_at"),
        text("created_by", "p.created_by"),
        integer("txid", "p.txid"),
    ),
    incremental=True,
)

ATTRIBUTE_HISTORY = Table(
    "attribute_history",
    "broker_attributehistory h JOIN broker_client c ON c.id = h.client_id "
    "LEFT JOIN broker_authority a ON a.id = h.authority_id",
    (
        integer("id", "h.id"),
        integer("client_id", "h.client_id"),
        text("client", "c.name"),
        text("name", "h.name"),
        text("kind", "h.kind"),
        text("value", "h.value::text"),
        text("source", "h.source"),
        text("authority", "a.name"),
        time("at", "h.at"),
        integer("txid", "h.txid"),
    ),
    incremental=True,
    kept="h.carried_from IS NULL",  # retention's copies: the dataset has the originals
)

# A client's region is its live `region` attribute (attested wins over stated).
CLIENT_REGION = (
    "(SELECT v.value #>> '{}' FROM broker_attributevalue v WHERE v.client_id = c.id "
    "AND v.name = 'region' AND v.revoked_at IS NULL "
    "AND (v.expires_at IS NULL OR v.expires_at > now()) "
    "ORDER BY v.source = 'attested' DESC, v.set_at DESC LIMIT 1)"
)

CLIENTS = Table(
    "clients",
    "broker_client c JOIN broker_clientmodel m ON m.id = c.model_id",
    (
        integer("id", "c.id"),
        text("name", "c.name"),
        text("model", "m.name"),
        text("region", CLIENT_REGION),
        integer("dispatcher_id", "c.dispatcher_id"),
        flag("can_send", "c.can_send"),
        flag("can_receive", "c.can_receive"),
        flag("is_active", "c.is_active"),
    ),
    incremental=False,
)

DISPATCHERS = Table(
    "dispatchers",
    "broker_dispatcher d LEFT JOIN broker_dispatchersummary s ON s.dispatcher_id = d.id",
    (
        integer("id", "d.id"),
        text("name", "d.name"),
        integer("parent_id", "d.parent_id"),
        integer("depth", "d.depth"),
        flag("is_leaf", "d.is_leaf"),
        integer("filters", "s.filters"),
        integer("constraints", "s.constraints"),
        integer("exact_filters", "s.exact_filters"),
        integer("summary_bytes", "octet_length(s.data::text)"),
        integer("loss_sampled", "s.loss_sampled"),
        integer("loss_extra", "s.loss_extra"),
    ),
    incremental=False,
)

TABLES: dict[str, Table] = {
    table.name: table
    for table in (
        EVENTS,
        DELIVERIES,
        HOPS,
        AUDIT,
        POLICY_VERSIONS,
        ATTRIBUTE_HISTORY,
        CLIENTS,
        DISPATCHERS,
    )
}


def in_current_layout(root: Path) -> bool:
    """Whether the dataset at `root` says it was written in this LAYOUT."""
    marker = root / LAYOUT_FILE
    return marker.exists() and marker.read_text().strip() == str(LAYOUT)


def batches(folder: Path) -> list[Path]:
    """The table's batch folders, oldest first."""
    if not folder.is_dir():
        return []
    found = [child for child in folder.iterdir() if child.name.startswith("batch=")]
    return sorted(found, key=batch_number)


def batch_number(batch: Path) -> int:
    """A batch folder's number (`batch=N`): the export's watermark that wrote it."""
    return int(batch.name.split("=", 1)[1])
