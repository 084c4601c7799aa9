"""The Reports pages: the five reports with their latest runs, and one page per report
(filters, the run's progress live, charts, tables a page at a time, CSV per section)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from urllib.parse import urlencode

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIRequest
from django.http import Http404, HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST
from django_htmx.http import HttpResponseClientRedirect

from broker import audit
from broker.errors import InvalidInput
from broker.roles import READ_AUDIT, READ_REPORTS, RUN_REPORTS
from console.access import actor_of, refuse, requires
from console.csv_cells import csv_text, safe_cell
from reports import reads, services
from reports.filters import DEFAULT_PRESET, PRESETS, parse_filters, preset_window, query_of
from reports.jobs import KINDS, job
from reports.models import ReportRun
from reports.results import Params, Section

TEMPLATE = "console/report.html"
LIVE_TARGET = "report-live"  # the id of the part that follows a run live
TABLE_TARGET = "table-"  # + a section's name: the id of its table
# What a report needs beyond READ_REPORTS to be read or run.
EXTRA_PERMISSION = {"audit": READ_AUDIT}
# The charts of each report's page (name, title), drawn by static/console/reports.js.
CHARTS = {
    "timeline": (("events", "Events over time by kind, with what the operators did"),),
    "reach": (
        ("outcomes", "How each command landed"),
        ("times", "Time until 50, 90 and 99 % acknowledged ok"),
    ),
    "audit": (
        ("refusals", "Refusals by reason, per actor (the 20 most refused)"),
        ("activity", "What was done and refused, by kind of action"),
    ),
    "tree": (
        ("forwards", "Per dispatcher: events routed, forwards and wasted forwards"),
        ("loss", "Per dispatcher: coagulation loss and wasted share"),
    ),
    "latency": (
        ("hops", "Time to delivery and to acknowledgement, by hop count"),
        ("regions", "Time to delivery and to acknowledgement, by region"),
    ),
}
# The sections those charts read (the others are tables only, and stay off the page's
# JSON).
CHART_SECTIONS = {
    "timeline": ("series", "markers"),
    "reach": ("commands",),
    "audit": ("refusals", "activity"),
    "tree": ("dispatchers",),
    "latency": ("by_hops", "by_region"),
}
ABOUT = {
    "timeline": "Events over time by kind, with the sends, policy changes and trust "
    "changes of the incident marked on the same axis.",
    "reach": "Per command: how many were targeted, answered ok, failed, did not answer "
    "or expired, and how long until 50, 90 and 99 % had answered ok.",
    "audit": "Who did what, the refusals by reason per actor and per policy, and the "
    "anomalies worth a look.",
    "tree": "Per dispatcher and per level: events routed, forwards and wasted forwards, "
    "deliveries, hop latency, and the summaries' size and coagulation loss.",
    "latency": "Time to delivery and to acknowledgement (p50, p95, p99) per hop count "
    "and per region.",
}


@require_GET
@requires(READ_REPORTS, action="report.view")
def report_index(request: HttpRequest) -> HttpResponse:
    """The five reports, each with its newest run's state and how fresh its data is;
    for htmx (as runs move on, topic `reports`), just the table."""
    newest = reads.newest_runs()
    reports = [
        {
            "kind": kind,
            "label": ReportRun.Kind(kind).label,
            "about": ABOUT[kind],
            "run": newest[kind],
            "query": page_query(services.params_of(newest[kind])) if newest[kind] else "",
            "readable": _may_read_kind(request, kind),
        }
        for kind in KINDS
    ]
    template = "console/reports.html#table" if request.htmx else "console/reports.html"
    return render(request, template, {"reports": reports})


@require_GET
@requires(READ_REPORTS, action="report.view")
def report_page(request: HttpRequest, kind: str) -> HttpResponse:
    """One report: the newest run with the filters the query states (or, with none, the
    newest run); for htmx, just the part it asks for (the live part, or one table)."""
    _known(kind)
    if not _may_read_kind(request, kind):
        return refuse(request, permission=EXTRA_PERMISSION[kind], action="report.view")
    if "preset" in request.GET:
        return _preset_redirect(request, kind)
    try:
        params = _shown_params(request, kind)
    except InvalidInput as problem:
        return _page(request, kind, None, problem=problem, status=400)
    return _page(request, kind, params)


@require_POST
@requires(RUN_REPORTS, action="report.run")
def run_report(request: HttpRequest, kind: str) -> HttpResponse:
    """Start the report over the posted filters (or find the same one running), then
    show its page, where it runs live."""
    _known(kind)
    if not _may_read_kind(request, kind):
        return refuse(request, permission=EXTRA_PERMISSION[kind], action="report.run")
    actor = actor_of(request)
    try:
        with audit.refusals_recorded(actor=actor, action="report.run", target="reports"):
            params = parse_filters(request.POST, regions=reads.regions(kind))
        services.request_run(kind=kind, params=params, actor=actor)
    except InvalidInput as problem:
        if request.htmx:
            return render(request, f"{TEMPLATE}#problem", {"problem": problem}, status=400)
        return _page(request, kind, None, problem=problem, status=400, typed=request.POST)
    url = report_page_url(kind, params)
    return HttpResponseClientRedirect(url) if request.htmx else redirect(url)


@require_GET
@requires(READ_REPORTS, action="report.export")
def export_csv(request: HttpRequest, run_id: int, section: str) -> HttpResponse:
    """Every row of one section of a run's results as CSV, streamed; audited."""
    run = get_object_or_404(ReportRun, pk=run_id, state=ReportRun.State.DONE)
    if not _may_read_kind(request, run.kind):
        return refuse(request, permission=EXTRA_PERMISSION[run.kind], action="report.export")
    sections = job(run.kind).SECTIONS
    if section not in sections:
        raise Http404(f"the {run.kind} report has no section {section!r}")
    services.record_export(actor=actor_of(request), run=run, section=section)
    chunks = csv_chunks(run, section, sections[section])
    if isinstance(request, ASGIRequest):  # an ASGI server streams async iterators only
        chunks = _async_chunks(chunks)
    response = StreamingHttpResponse(chunks, content_type="text/csv; charset=utf-8")
    name = f"{run.kind}-{run.pk}-{section}.csv"
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    return response


def _known(kind: str) -> None:
    if kind not in KINDS:
        raise Http404(f"no report {kind!r}")


def _may_read_kind(request: HttpRequest, kind: str) -> bool:
    extra = EXTRA_PERMISSION.get(kind)
    return extra is None or request.user.has_perm(extra)


def report_page_url(kind: str, params: Params) -> str:
    """The page of report `kind` showing `params` (the event page links one too)."""
    return f"{reverse('report', args=[kind])}?{page_query(params)}"


def page_query(params: Params) -> str:
    """The query of a report's page showing `params` (times readable: `:` kept)."""
    return urlencode(query_of(params), safe=":")


def _preset_redirect(request: HttpRequest, kind: str) -> HttpResponse:
    """A preset becomes its window, in the URL: a link that shows the same run later."""
    try:
        window = preset_window(request.GET["preset"])
    except InvalidInput as problem:
        return _page(request, kind, None, problem=problem, status=400)
    region = request.GET.get("region", "")
    return redirect(report_page_url(kind, Params(window.window_start, window.window_end, region)))


def _shown_params(request: HttpRequest, kind: str) -> Params:
    """The filters the query states; with none, those of the newest run (or the
    default window, when there is no run yet)."""
    if not any(name in request.GET for name in ("from", "to", "region")):
        newest = reads.newest_run(kind)
        return services.params_of(newest) if newest else preset_window(DEFAULT_PRESET)
    return parse_filters(request.GET, regions=reads.regions(kind))


def _page(request, kind, params, *, problem=None, status=200, typed=None) -> HttpResponse:
    context = {
        "kind": kind,
        "label": ReportRun.Kind(kind).label,
        "about": ABOUT[kind],
        "presets": PRESETS,
        "regions": reads.regions(kind),
        "problem": problem,
        "filters": typed if typed is not None else (query_of(params) if params else request.GET),
        "live_target": LIVE_TARGET,
        "charts": CHARTS[kind],
    }
    if params is not None:
        context.update(_runs_context(request, kind, params))
    return render(request, _template_for(request, context), context, status=status)


def _template_for(request: HttpRequest, context: dict) -> str:
    """The whole page, or the part htmx asks for: the live part, or one table (which
    goes in the context as `table`)."""
    target = (request.htmx.target or "") if request.htmx else ""
    if target == LIVE_TARGET:
        return f"{TEMPLATE}#live"
    name = target.removeprefix(TABLE_TARGET)
    tables = {table.name: table for table in context.get("tables", ())}
    if target.startswith(TABLE_TARGET) and name in tables:
        context["table"] = tables[name]
        return f"{TEMPLATE}#table-part"
    return TEMPLATE


def _runs_context(request: HttpRequest, kind: str, params: Params) -> dict:
    """The newest run with these filters (its progress or error, when it has no
    results), and the newest one with results: its figures, charts and tables."""
    latest = reads.newest_run(kind, params)
    done = latest if latest and latest.state == ReportRun.State.DONE else None
    if done is None and latest is not None:
        done = reads.newest_done_run(kind, params)
    context = {"latest": latest, "run": done, "query": page_query(params)}
    if latest is not None and latest.state == ReportRun.State.QUEUED:
        context["ahead"] = reads.runs_ahead_of(latest)
    if done is not None:
        context.update(_results_context(request, done))
    return context


def _results_context(request: HttpRequest, run: ReportRun) -> dict:
    sections = job(run.kind).SECTIONS
    counts = reads.row_counts(run)
    tables = [
        reads.section_page(run, name, section, _section_query(request, name))
        for name, section in sections.items()
    ]
    return {
        "data_id": f"report-data-{run.pk}",
        "exported_before_s": _seconds_between(run.data_as_of, run.finished_at),
        "tables": tables,
        "row_total": sum(counts.values()),
        "chart_data": _chart_data(run, sections),
        "summary": run.summary,
    }


def _seconds_between(earlier, later) -> float | None:
    return (later - earlier).total_seconds() if earlier and later else None


def _section_query(request: HttpRequest, name: str) -> reads.SectionQuery:
    page = request.GET.get(f"{name}-page", "1")
    number = int(page) if page.isascii() and page.isdigit() and len(page) < 7 else 1
    return reads.SectionQuery(sort=request.GET.get(f"{name}-sort", "")[:64], page=number)


def _chart_data(run: ReportRun, sections: dict[str, Section]) -> dict:
    """What the page's charts draw (static/console/reports.js): the window, the
    figures, and the first rows of the sections they read, in the job's order."""
    return {
        "kind": run.kind,
        "window": [run.window_start.isoformat(), run.window_end.isoformat()],
        "summary": run.summary,
        "sections": {
            name: {
                "label": section.label,
                "fields": [{"name": f.name, "type": f.type} for f in section.fields],
                "rows": reads.chart_rows(run, name),
            }
            for name, section in sections.items()
            if name in CHART_SECTIONS[run.kind]
        },
    }  # fmt: skip


def csv_chunks(run: ReportRun, name: str, section: Section) -> Iterator[str]:
    """The header (the fields' names), then the rows a batch per chunk; values as the
    job wrote them (times ISO 8601, UTC), cells formula-safe."""
    names = section.field_names
    yield csv_text([names])
    for batch in reads.export_batches(run, name):
        yield csv_text([[_cell(data.get(field)) for field in names] for data in batch])


def _cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return safe_cell(value) if isinstance(value, str) else str(value)


async def _async_chunks(chunks: Iterator[str]) -> AsyncIterator[str]:
    step = sync_to_async(next)
    while (chunk := await step(chunks, None)) is not None:
        yield chunk
