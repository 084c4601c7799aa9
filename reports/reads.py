"""Reads of the reports' runs and results that the pages, the CSV and the tests share:
which run a page shows, a section's rows a page at a time sorted on the server by one
of its fields, and the regions one can filter by."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime

from django.core.paginator import Page, Paginator
from django.db.models import Count, DateTimeField, FloatField, QuerySet
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast

from broker.reads.clients import live_attribute_values
from reports.jobs import KINDS
from reports.models import ReportRow, ReportRun
from reports.results import Field, Params, Section

ROWS_PER_PAGE = 25
CHART_ROWS = 5000  # rows of a section drawn in its charts; the table and CSV have all
EXPORT_BATCH = 2000
NUMERIC_TYPES = frozenset({"int", "float", "percent", "seconds"})
UNFINISHED = (ReportRun.State.QUEUED, ReportRun.State.RUNNING)


def newest_runs() -> dict[str, ReportRun | None]:
    """Each report's newest run (any state, any filters), or None."""
    return {kind: newest_run(kind) for kind in KINDS}


def newest_run(kind: str, params: Params | None = None) -> ReportRun | None:
    """The newest run of `kind` (any state), with exactly `params` if given."""
    return _runs(kind, params).first()


def newest_done_run(kind: str, params: Params) -> ReportRun | None:
    """The newest run of `kind` with exactly `params` that has results."""
    return _runs(kind, params).filter(state=ReportRun.State.DONE).first()


def _runs(kind: str, params: Params | None) -> QuerySet[ReportRun]:
    runs = ReportRun.objects.filter(kind=kind)
    if params is not None:
        runs = runs.filter(
            window_start=params.window_start,
            window_end=params.window_end,
            region=params.region,
        )
    return runs.order_by("-created_at", "-pk")


def runs_ahead_of(run: ReportRun) -> int:
    """How many runs the one reports worker takes before this queued one."""
    return ReportRun.objects.filter(state__in=UNFINISHED, created_at__lt=run.created_at).count()


def regions(kind: str | None = None) -> list[str]:
    """The regions to filter by: every live `region` attribute's value, and those
    that runs of `kind` were made for (a region may have emptied since)."""
    live = live_attribute_values().filter(name="region").values_list("value", flat=True)
    found = {value for value in live.distinct() if isinstance(value, str) and value}
    if kind is not None:
        asked = ReportRun.objects.filter(kind=kind).exclude(region="")
        found.update(asked.values_list("region", flat=True).distinct())
    return sorted(found)


def row_counts(run: ReportRun) -> dict[str, int]:
    """How many rows each section of the run's results has (missing: none)."""
    counts = run.rows.values("section").order_by().annotate(count=Count("pk"))
    return {row["section"]: row["count"] for row in counts}


@dataclass(frozen=True)
class SectionQuery:
    """Which page of a section, sorted by which field (`sort`: a field's name, `-` in
    front for descending; empty for the job's own order)."""

    sort: str = ""
    page: int = 1

    @property
    def field(self) -> str:
        return self.sort.removeprefix("-")

    @property
    def descending(self) -> bool:
        return self.sort.startswith("-")


@dataclass
class SectionPage:
    """One page of a section's rows, each a list of its fields' values, typed."""

    name: str
    section: Section
    query: SectionQuery
    page: Page
    rows: list[list]


def section_page(
    run: ReportRun, name: str, section: Section, query: SectionQuery, *, size: int = ROWS_PER_PAGE
) -> SectionPage:
    """A page of the section `name` of `run`, sorted on the server by `query.sort`
    (cast by the field's declared type; no value last), then the job's order. An
    unknown field sorts in the job's order."""
    rows = ReportRow.objects.filter(run=run, section=name)
    field = _field(section, query.field)
    if field is None:
        query = SectionQuery(page=query.page)
        rows = rows.order_by("position")
    else:
        rows = rows.order_by(_sort_key(field, query.descending), "position")
    page = Paginator(rows.values_list("data", flat=True), size).get_page(query.page)
    typed = [typed_values(section, data) for data in page.object_list]
    return SectionPage(name=name, section=section, query=query, page=page, rows=typed)


def _field(section: Section, name: str) -> Field | None:
    return next((f for f in section.fields if f.name == name), None)


def _sort_key(field: Field, descending: bool):
    value = KeyTextTransform(field.name, "data")
    if field.type in NUMERIC_TYPES:
        value = Cast(value, FloatField())
    elif field.type == "time":
        value = Cast(value, DateTimeField())
    return value.desc(nulls_last=True) if descending else value.asc(nulls_last=True)


def typed_values(section: Section, data: dict) -> list:
    """A row's values in the section's field order, each cast by its declared type
    (times as datetimes, numbers as numbers; None where missing or unreadable)."""
    return [cast_value(field, data.get(field.name)) for field in section.fields]


def cast_value(field: Field, value):
    """`value` as `field`'s type says, or None when it is missing or unreadable."""
    if value is None:
        return None
    try:
        if field.type == "int":
            return int(value)
        if field.type in NUMERIC_TYPES:
            return float(value)
        if field.type == "time":
            return datetime.fromisoformat(str(value))
    except (TypeError, ValueError):
        return None
    if isinstance(value, bool):
        return "yes" if value else "no"
    return value if isinstance(value, str) else str(value)


def chart_rows(run: ReportRun, name: str, *, limit: int = CHART_ROWS) -> list[dict]:
    """The first `limit` rows of a section, in the job's order, as the job wrote them."""
    rows = ReportRow.objects.filter(run=run, section=name).order_by("position")
    return list(rows.values_list("data", flat=True)[:limit])


def export_batches(run: ReportRun, name: str, *, size: int = EXPORT_BATCH) -> Iterator[list]:
    """Every row of a section in the job's order, `size` at a time (each batch read
    from where the last ended: no long transaction, no server cursor)."""
    last = -1
    while True:
        batch = list(
            ReportRow.objects.filter(run=run, section=name, position__gt=last)
            .order_by("position")
            .values_list("position", "data")[:size]
        )
        if not batch:
            return
        last = batch[-1][0]
        yield [data for _, data in batch]


def finished_run_seconds() -> list[tuple[str, str, float]]:
    """(kind, state, seconds from start to finish) of every run that finished."""
    finished = ReportRun.objects.filter(started_at__isnull=False, finished_at__isnull=False)
    rows = finished.values_list("kind", "state", "started_at", "finished_at")
    return [(kind, state, (end - start).total_seconds()) for kind, state, start, end in rows]


def running_run() -> ReportRun | None:
    """The run the reports worker is on (runs go one at a time), if any."""
    return ReportRun.objects.filter(state=ReportRun.State.RUNNING).order_by("-started_at").first()
