"""What several report jobs read the same way: the events of a window, the receivers of
a region, deliveries' states in the event page's words (broker.reads.progress), times as ISO
8601 text, and small results as JSON-ready rows.

Everything here is a Spark DataFrame operation; only `rows` collects, and only what a
job has already aggregated and bounded.
"""

from __future__ import annotations

from datetime import UTC, datetime, time, timedelta

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from broker.models import Delivery
from broker.reads.progress import NO_REGION, UNANSWERED_STATES
from reports.results import Params
from reports.spark import Dataset

State = Delivery.State
# The event page's words for a delivery's state (broker.reads.progress.Tally): `received`
# means the agent has it (answered or not); `no answer` is still waiting (recorded or
# received, not answered, not expired); `expired` never reached its agent.
RECEIVED_STATES = (State.DELIVERED, State.ACKED, State.FAILED)
WAITING_STATES = (State.PENDING, State.DELIVERED)
NEVER_ANSWERED_STATES = tuple(str(state) for state in UNANSWERED_STATES)
MICROS = 1_000_000.0
ONE_DAY = timedelta(days=1)
ISO_UTC = "yyyy-MM-dd'T'HH:mm:ss.SSSSSS'Z'"  # the session's time zone is UTC


def in_window(column: str, params: Params) -> Column:
    """Whether the time in `column` is in [window_start, window_end) (false when null).

    Tested twice: against the whole days around the window, compared as readers can
    skip by (files, row groups and kept batches outside those days are not read), and
    against the window itself, by `at_or_after` and `before` (no code compiled again
    for a new window within those days)."""
    return F.expr(window_text(column, params))


def window_text(column: str, params: Params) -> str:
    """`in_window` as SQL text, for a query written as text."""
    start, end = params.window_start, params.window_end
    days = f"`{column}` >= {_time(_day_of(start))} AND `{column}` < {_time(_day_of(end) + ONE_DAY)}"
    return f"{days} AND {at_or_after_text(column, start)} AND {_compared(column, '<', end)}"


def before(column: str, moment: datetime) -> Column:
    """Whether the time in `column` is before `moment` (false when null).

    Spark writes a time literal into the code it compiles for a query, so a query with
    a new time was compiled again (0.5 to 1 s a report, on every change of window); a
    literal inside a struct reaches that code as an object instead, and the code
    compiled for one window serves the next. Structs compare as their fields do."""
    return F.expr(_compared(column, "<", moment))


def at_or_after(column: str, moment: datetime) -> Column:
    """Whether the time in `column` is `moment` or later (false when null); see `before`."""
    return F.expr(at_or_after_text(column, moment))


def at_or_after_text(column: str, moment: datetime) -> str:
    """`at_or_after` as SQL text, in parentheses."""
    return _compared(column, ">=", moment)


# The conditions are SQL text, parsed by Spark in one call: built of Column objects,
# each part was a call from Python to the JVM (a twentieth of a second a run).
def _compared(column: str, operator: str, moment: datetime) -> str:
    """Whether the time in `column` compares with `moment` by `operator` (false when
    null), both boxed (see `before`)."""
    boxed = _boxed(f"`{column}`")
    return f"(`{column}` IS NOT NULL AND {boxed} {operator} {_boxed(_time(moment))})"


def _boxed(value: str) -> str:
    return f"named_struct('t', {value})"


def sql_text(value: str) -> str:
    """`value` as a SQL string literal: every UTF-16 code unit as a unicode escape, so
    that neither quotes nor control characters need care. (Spark's escape takes four
    hex digits: a character beyond them, an emoji, goes as its two surrogates.)"""
    units = value.encode("utf-16-be")
    escaped = (f"\\u{units[i]:02x}{units[i + 1]:02x}" for i in range(0, len(units), 2))
    return "'" + "".join(escaped) + "'"


def _time(moment: datetime) -> str:
    """`moment` as a SQL time literal, to the microsecond, in UTC."""
    return f"TIMESTAMP '{moment.astimezone(UTC).strftime('%Y-%m-%d %H:%M:%S.%f')}Z'"


def _day_of(moment: datetime) -> datetime:
    return datetime.combine(moment.astimezone(UTC).date(), time.min, tzinfo=UTC)


def window_events(data: Dataset, params: Params) -> DataFrame:
    """The events published in [window_start, window_end)."""
    return data.table("events").where(in_window("published_at", params))


def receivers(data: Dataset, params: Params) -> DataFrame:
    """Clients as receivers (receiver_id, receiver, region; a client without a region
    is in NO_REGION), only the region's when the run is for one."""
    return in_region(every_receiver(data), params)


def every_receiver(data: Dataset) -> DataFrame:
    """Every client as a receiver (see `receivers`)."""
    return data.table("clients").select(
        F.col("id").alias("receiver_id"),
        F.col("name").alias("receiver"),
        F.coalesce(F.col("region"), F.lit(NO_REGION)).alias("region"),
        F.col("dispatcher_id").alias("receiver_dispatcher"),
    )


# What the reports read of a delivery (the frames joined with receivers hold these only).
DELIVERY_COLUMNS_READ = (
    "event_id", "published_at", "receiver_id", "sender_id", "state", "delivered_at", "acked_at",
)  # fmt: skip


# What is read of the deliveries to receivers as kept: what the timeline and the reach
# count and time by event and region, and what the audit matches receivers' policies
# by. Not the receiver's name, leaf or sender: kept for 10,000,000 deliveries, those
# made keeping them a third slower (21 to 30 s against 15 to 20).
KEPT_DELIVERY_COLUMNS = (
    "id", "event_id", "published_at", "receiver_id", "state", "delivered_at", "acked_at", "region",
)  # fmt: skip


def deliveries_to_receivers(data: Dataset) -> DataFrame:
    """Every delivery to a client, with the receiver's region (KEPT_DELIVERY_COLUMNS):
    joined once and kept by a warm session, not at each query (a broadcast costs a
    Spark job); an export that adds deliveries joins only those."""
    return data.derived_rows(
        "deliveries to receivers",
        "deliveries",
        ("clients",),
        lambda rows: with_receivers(data, rows).select(*KEPT_DELIVERY_COLUMNS),
    )


def in_region(frame: DataFrame, params: Params) -> DataFrame:
    """The rows of `frame` of the run's region (its `region` column), or all of them."""
    return frame.where(F.col("region") == params.region) if params.region else frame


def with_receivers(data: Dataset, deliveries: DataFrame) -> DataFrame:
    """`deliveries` (rows of the table) to clients, with the receiver's name, region
    and leaf."""
    deliveries = deliveries.select("id", *DELIVERY_COLUMNS_READ)
    return deliveries.join(F.broadcast(every_receiver(data)), "receiver_id")


def is_state(*states: str) -> Column:
    return F.col("state").isin(*[str(state) for state in states])


def count_where(condition: Column) -> Column:
    return F.sum(F.when(condition, 1).otherwise(0)).cast("long")


def state_counts() -> list[Column]:
    """A delivery aggregate's counts, as the event page counts them."""
    return [
        F.count(F.lit(1)).alias("targeted"),
        count_where(is_state(*RECEIVED_STATES)).alias("delivered"),
        count_where(is_state(State.ACKED)).alias("acked_ok"),
        count_where(is_state(State.FAILED)).alias("failed"),
        count_where(is_state(*WAITING_STATES)).alias("no_answer"),
        count_where(is_state(State.EXPIRED)).alias("expired"),
    ]


def micros_between(start: str, end: str) -> Column:
    """Microseconds from column `start` to column `end` (null if either is)."""
    return F.unix_micros(F.col(end)) - F.unix_micros(F.col(start))


def seconds(micros: Column) -> Column:
    return micros / F.lit(MICROS)


def iso(column: str | Column) -> Column:
    """A timestamp as ISO 8601 text in UTC, to the microsecond."""
    return F.date_format(column, ISO_UTC)


def rows(frame: DataFrame, fields: list[str], *, limit: int | None = None) -> list[dict]:
    """The frame's rows (at most `limit`) as dicts of `fields`: JSON-ready when the
    frame already made times text."""
    if limit is not None:
        frame = frame.limit(limit)
    return [row.asDict() for row in frame.select(*fields).collect()]
