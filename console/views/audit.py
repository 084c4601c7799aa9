"""The Audit log page: every change, send and refusal, filtered by actor, action,
target, outcome and time, a page at a time, and exported as CSV."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from datetime import tzinfo

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIRequest
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET

from auditchain.reads import chain_state, links_of
from broker.errors import InvalidInput
from broker.reads.audit import OUTCOMES, AuditQuery, audit_page, export_batches
from broker.roles import READ_AUDIT
from broker.services.audit_exports import record_export
from console.access import actor_of, requires
from console.csv_cells import csv_text, safe_cell

TEMPLATE = "console/audit.html"
FILTERS_FORM = "audit-filters"  # the form's id: its own requests need no fresh copy
# Sortable columns: (label, ascending order, descending order); time is newest first.
SORTABLE = {"time": ("at", "-at"), "actor": ("actor", "-actor"), "action": ("action", "-action")}
# The last three are the entry's evidence (docs/security.md): its authentication code,
# its position in the chain and the link's code (empty until it is linked).
CSV_COLUMNS = ("id", "at", "actor", "action", "target", "outcome", "reason", "details",
               "mac", "link", "chain")  # fmt: skip


@require_GET
@requires(READ_AUDIT, action="audit.view")
def audit_log(request: HttpRequest) -> HttpResponse:
    """The log, or (for htmx) just its results; a filter that cannot be read is
    answered 400 saying which and why."""
    context = {
        "form": request.GET,
        "outcomes": OUTCOMES,
        "sortable": SORTABLE,
        # Results asked for by a link (a value, a column, a page) bring the filters'
        # form up to date; the form's own requests must not replace what is typed.
        "refresh_filters": bool(request.htmx) and request.htmx.trigger != FILTERS_FORM,
    }
    if not request.htmx:  # the chain's state is shown above the results, not in them
        context["chain"] = chain_state()
    status = 200
    try:
        context["page"] = audit_page(AuditQuery.from_params(request.GET))
    except InvalidInput as error:
        context["problem"], status = error, 400
    template = f"{TEMPLATE}#results" if request.htmx else TEMPLATE
    return render(request, template, context, status=status)


@require_GET
@requires(READ_AUDIT, action="audit.export")
def export_csv(request: HttpRequest) -> HttpResponse:
    """Every entry the page's filters choose (not one page) as CSV, streamed; the
    export is itself audited."""
    try:
        query = replace(AuditQuery.from_params(request.GET), after=None, before=None)
    except InvalidInput as error:
        return HttpResponse(error.message, status=400, content_type="text/plain")
    record_export(actor=actor_of(request), query=query)
    # Django serves a stream of the other kind whole, from memory: give each server
    # the kind it streams (ASGI async, WSGI and the test client sync).
    chunks = csv_chunks_async(query) if isinstance(request, ASGIRequest) else csv_chunks(query)
    response = StreamingHttpResponse(chunks, content_type="text/csv; charset=utf-8")
    stamp = timezone.localtime().strftime("%Y%m%d-%H%M%S")
    response["Content-Disposition"] = f'attachment; filename="audit-log-{stamp}.csv"'
    return response


def csv_chunks(query: AuditQuery) -> Iterator[str]:
    """The header, then the matching entries a batch per chunk."""
    zone = timezone.get_current_timezone()
    yield csv_text([CSV_COLUMNS])
    for batch in export_batches(query):
        yield csv_text(csv_rows(batch, zone))


async def csv_chunks_async(query: AuditQuery) -> AsyncIterator[str]:
    """csv_chunks for an ASGI server: each batch is read in Django's sync thread."""
    chunks = csv_chunks(query)
    step = sync_to_async(next)
    while (chunk := await step(chunks, None)) is not None:
        yield chunk


def csv_rows(batch: list, zone: tzinfo) -> list[list[str]]:
    """Exported rows (broker.reads.audit.EXPORTED) as CSV cells: the time in ISO 8601
    in `zone`, the details as JSON text, and the entry's evidence."""
    links = links_of(row.id for row in batch)
    return [
        [str(row.id), row.at.astimezone(zone).isoformat(), *map(safe_cell, (row.actor,
         row.action, row.target, row.outcome, row.reason, row.details_text)), row.mac,
         *map(str, links.get(row.id, ("", "")))]
        for row in batch
    ]  # fmt: skip
