"""Reading the audit log: entries chosen by actor, action, target, outcome and time,
one page at a time or every one of them for an export.

Pages are read from where the previous one ended (keyset paging: `after` or `before`
an entry), so that the thousandth page costs what the first does, and the total is
counted only up to COUNT_LIMIT. Each filter and order has an index (AuditEntry.Meta).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db.models import F, Q, QuerySet, TextField
from django.db.models.functions import Cast
from django.db.models.lookups import Lookup
from django.utils import timezone

from broker.audit import SHORT_TEXT
from broker.errors import InvalidInput
from broker.models import AuditEntry

PAGE_SIZE = 50
EXPORT_BATCH = 2_000
COUNT_LIMIT = 10_000  # counted exactly up to here; beyond, "more than"
WILDCARD = "*"
# An order: the columns it sorts by, each (name, descending). The last is unique, so a
# page can start exactly after any entry. Within one actor or action, newest first.
ORDERS = {
    "-at": (("at", True), ("id", True)),
    "at": (("at", False), ("id", False)),
    "actor": (("actor", False), ("at", True), ("id", True)),
    "-actor": (("actor", True), ("at", True), ("id", True)),
    "action": (("action", False), ("at", True), ("id", True)),
    "-action": (("action", True), ("at", True), ("id", True)),
}
DEFAULT_ORDER = "-at"
OUTCOMES = tuple(AuditEntry.Outcome.values)
# The query string's names of AuditQuery's fields (the page's links and the export).
PARAMETERS = {
    "actor": "actor", "action": "action", "target": "target", "outcome": "outcome",
    "since": "from", "until": "to", "order": "sort", "after": "after", "before": "before",
}  # fmt: skip
TEXT_LIMITS = {"actor": SHORT_TEXT, "action": 64, "target": SHORT_TEXT}
# The time of day in an ISO date and time: hours, then minutes and seconds if written.
TIME_OF_DAY = re.compile(r"[T ](\d\d)(?::?(\d\d))?(?::?(\d\d))?")


@dataclass(frozen=True)
class AuditQuery:
    """Which entries, in what order, from where. Text filters match exactly; `*`
    matches any text (`user:*`, `event.*`, `*web-00042*`); an actor ending in `:` or
    an action ending in `.` is a prefix too."""

    actor: str = ""
    action: str = ""
    target: str = ""
    outcome: str = ""  # one of OUTCOMES, or "" for both
    since: datetime | None = None  # from this moment on
    until: datetime | None = None  # before this moment (`to` is the second before it)
    order: str = DEFAULT_ORDER
    after: int | None = None  # the page starts after this entry...
    before: int | None = None  # ...or ends before it

    @property
    def filtered(self) -> bool:
        """Whether any filter narrows the log (the order and the page do not)."""
        fields = (self.actor, self.action, self.target, self.outcome, self.since, self.until)
        return any(fields)

    def params(self) -> dict[str, str]:
        """The query as its link's parameters, without the empty ones and the default
        order: `{"actor": "user:olivia", "from": "2026-05-01T12:00:00"}`."""
        found = {}
        for name, parameter in PARAMETERS.items():
            value = getattr(self, name)
            if value in ("", None) or (name == "order" and value == DEFAULT_ORDER):
                continue
            if name == "until":  # `to` is the last second the window includes
                value -= timedelta(seconds=1)
            found[parameter] = _moment_text(value) if isinstance(value, datetime) else str(value)
        return found

    @classmethod
    def from_params(cls, params: Mapping[str, str]) -> AuditQuery:
        """The query a link's parameters state; InvalidInput naming the parameter if
        one cannot be read (an unknown order falls back to the newest first)."""
        outcome = params.get("outcome", "").strip()
        if outcome not in ("", *OUTCOMES):
            raise InvalidInput(f"outcome must be {' or '.join(OUTCOMES)}", field="outcome")
        order = params.get("sort", DEFAULT_ORDER)
        since, until = _time_window(params)
        return cls(
            **{name: _text(params, name) for name in TEXT_LIMITS},
            outcome=outcome,
            since=since,
            until=until,
            order=order if order in ORDERS else DEFAULT_ORDER,
            after=_entry_id(params, "after"),
            before=_entry_id(params, "before"),
        )


def _time_window(params: Mapping[str, str]) -> tuple[datetime | None, datetime | None]:
    """(from, before) as `from` and `to` state them: `to` includes all of the day,
    minute or second it names."""
    since = parse_moment(params.get("from", ""), field="from")
    to = parse_moment(params.get("to", ""), field="to")
    until = to[0] + to[1] if to else None
    if since and until and until <= since[0]:
        raise InvalidInput("to is earlier than from", field="to")
    return (since[0] if since else None), until


def _text(params: Mapping[str, str], name: str) -> str:
    value = params.get(name, "").strip()
    if len(value) > TEXT_LIMITS[name]:
        raise InvalidInput(f"{name} is longer than {TEXT_LIMITS[name]} characters", field=name)
    return value


def _entry_id(params: Mapping[str, str], name: str) -> int | None:
    value = params.get(name, "").strip()
    if not value:
        return None
    if not value.isascii() or not value.isdigit() or len(value) > 18:
        raise InvalidInput(f"{name} must be an entry's number, not {value[:40]!r}", field=name)
    return int(value)


def parse_moment(text: str, *, field: str) -> tuple[datetime, timedelta] | None:
    """An ISO date and time (`2026-05-01T12:30`; seconds and offset optional, UTC when
    no offset is given) or a date, cut to the second, and how long the written value
    lasts (a day, an hour, a minute or a second); None when empty; InvalidInput naming
    `field` otherwise."""
    text = text.strip()
    if not text:
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise InvalidInput(
            f"{field}: {text[:40]!r} is not a date and time (write 2026-05-01T12:30, UTC)",
            field=field,
        ) from None
    if not moment.tzinfo:
        moment = timezone.make_aware(moment, timezone.get_current_timezone())
    return moment.replace(microsecond=0), _written_span(text)


def _written_span(text: str) -> timedelta:
    found = TIME_OF_DAY.search(text)
    if found is None:
        return timedelta(days=1)
    if found[3]:
        return timedelta(seconds=1)
    return timedelta(minutes=1) if found[2] else timedelta(hours=1)


def _moment_text(moment: datetime) -> str:
    """A moment as the page's datetime-local fields and links write it: to the
    second, in the console's time zone."""
    return timezone.localtime(moment).strftime("%Y-%m-%dT%H:%M:%S")


class Like(Lookup):
    """SQL LIKE with the pattern as given (Django's lookups escape % and _ away)."""

    lookup_name = "like"

    def as_sql(self, compiler, connection):
        lhs, lhs_params = self.process_lhs(compiler, connection)
        rhs, rhs_params = self.process_rhs(compiler, connection)
        return f"{lhs} LIKE {rhs}", [*lhs_params, *rhs_params]


def text_matches(name: str, value: str) -> Q | Lookup:
    """`name` equal to `value`, or, with wildcards in it, LIKE the pattern it says."""
    if (name == "actor" and value.endswith(":")) or (name == "action" and value.endswith(".")):
        value += WILDCARD
    if WILDCARD not in value:
        return Q(**{name: value})
    escaped = [part.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
               for part in value.split(WILDCARD)]  # fmt: skip
    return Like(F(name), "%".join(escaped))


def matching(query: AuditQuery) -> QuerySet[AuditEntry]:
    """The entries the query's filters choose, unordered."""
    entries = AuditEntry.objects.all()
    for name in TEXT_LIMITS:
        value = getattr(query, name)
        if value:
            entries = entries.filter(text_matches(name, value))
    if query.outcome:
        entries = entries.filter(outcome=query.outcome)
    if query.since:
        entries = entries.filter(at__gte=query.since)
    if query.until:
        entries = entries.filter(at__lt=query.until)
    return entries


@dataclass
class AuditPage:
    """One page of entries, whether there are more either side, and how many match
    in all (counted up to COUNT_LIMIT)."""

    query: AuditQuery
    entries: list[AuditEntry] = field(default_factory=list)
    has_next: bool = False
    has_previous: bool = False
    total: int = 0

    @property
    def total_is_exact(self) -> bool:
        return self.total <= COUNT_LIMIT

    @property
    def next_after(self) -> int | None:
        return self.entries[-1].pk if self.has_next and self.entries else None

    @property
    def previous_before(self) -> int | None:
        return self.entries[0].pk if self.has_previous and self.entries else None


def audit_page(query: AuditQuery, *, size: int = PAGE_SIZE) -> AuditPage:
    """The page of entries the query asks for: the first, or the one after (or
    before) an entry; InvalidInput if that entry does not exist."""
    entries = matching(query)
    # Unordered: any index that answers the filters may be read alone to count.
    page = AuditPage(query=query, total=entries.order_by()[: COUNT_LIMIT + 1].count())
    if query.before is not None:
        cursor = _cursor(query.before, "before")
        rows = rows_past(entries, query.order, cursor, size + 1, backwards=True)
        page.has_previous, page.has_next = len(rows) > size, True
        page.entries = rows[:size][::-1]
    else:
        cursor = None if query.after is None else _cursor(query.after, "after")
        rows = rows_past(entries, query.order, cursor, size + 1)
        page.has_next, page.has_previous = len(rows) > size, cursor is not None
        page.entries = rows[:size]
    return page


# What an export reads of each entry; the details as the database writes them in JSON
# (no decoding and encoding again of 300,000 documents).
EXPORTED = ("id", "at", "actor", "action", "target", "outcome", "reason", "details_text", "mac")


def export_batches(query: AuditQuery, *, size: int = EXPORT_BATCH) -> Iterator[list]:
    """Every entry the query's filters choose, in its order, `size` at a time, each
    batch read from where the last ended (no long transaction, no server cursor).
    Rows are named tuples of EXPORTED."""
    entries = matching(query).annotate(details_text=Cast("details", TextField()))
    rows = entries.values_list(*EXPORTED, named=True)
    cursor = None
    while True:
        batch = rows_past(rows, query.order, cursor, size)
        if batch:
            yield batch
        if len(batch) < size:
            return
        cursor = batch[-1]


def _cursor(entry_id: int, name: str) -> AuditEntry:
    """The entry a page starts after (or ends before)."""
    found = AuditEntry.objects.filter(pk=entry_id).only("at", "actor", "action").first()
    if found is None:
        raise InvalidInput(f"{name}: there is no entry {entry_id}", field=name)
    return found


def rows_past(entries: QuerySet, order: str, cursor, limit: int, *, backwards=False) -> list:
    """Up to `limit` of `entries` in `order` (reversed if `backwards`) that come after
    `cursor` (an entry, or a row with its at, actor, action and id; None: from the
    start).

    Past the cursor lie, in order: rows equal to it in every column but the last and
    beyond it in that one, then rows equal in all columns but the last two and beyond
    it in the one before, and so on. Each of these is one range of an index (an
    equal prefix, one bound), read only as far as the page needs: however far in the
    cursor is, a page costs what the first does.
    """
    columns = [(name, descending != backwards) for name, descending in ORDERS[order]]
    ordered = entries.order_by(*(f"-{name}" if desc else name for name, desc in columns))
    if cursor is None:
        return list(ordered[:limit])
    found: list = []
    for depth in reversed(range(len(columns))):
        equal = {name: getattr(cursor, name) for name, _ in columns[:depth]}
        name, descending = columns[depth]
        beyond = {f"{name}__{'lt' if descending else 'gt'}": getattr(cursor, name)}
        found += ordered.filter(**equal, **beyond)[: limit - len(found)]
        if len(found) >= limit:
            break
    return found
