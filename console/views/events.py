"""Events: the recent ones, and one event's page where an operator watches it land,
live, server by server, and resends to those that did not answer."""

from __future__ import annotations

from datetime import timedelta

from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.utils import timezone
from django.views.decorators.http import require_GET

from broker.models import Event
from broker.reads.progress import event_progress, failed, recent_events, unanswered, with_counts
from broker.roles import READ
from console.access import requires
from console.views.reports import report_page_url
from reports.results import Params

EVENTS_PER_PAGE = 50


@require_GET
@requires(READ, action="event.list")
def event_list(request: HttpRequest) -> HttpResponse:
    """Recent events, newest first, with how each landed so far."""
    sender = request.GET.get("sender", "")[:128]
    live_only = request.GET.get("live") == "1"
    page = Paginator(recent_events(sender=sender, live_only=live_only), EVENTS_PER_PAGE).get_page(
        request.GET.get("page")
    )
    with_counts(list(page.object_list))
    context = {"page": page, "sender": sender, "live_only": live_only, "now": timezone.now()}
    template = "console/events.html#table" if request.htmx else "console/events.html"
    return render(request, template, context)


@require_GET
@requires(READ, action="event.view")
def event_page(request: HttpRequest, event_id) -> HttpResponse:
    """One event: its progress overall, per region and per dispatcher, who has not
    answered and who failed; the live part is re-read when the event changes."""
    event = get_object_or_404(Event.objects.select_related("sender", "resend_of"), pk=event_id)
    progress = event_progress(event)
    context = {
        "event": event,
        "progress": progress,
        "resends": list(event.resends.order_by("published_at").values("pk", "published_at")),
    }
    if progress.archived:
        context["archived_reports"] = _reports_covering(event)
    else:
        context["waiting"] = unanswered(progress, page=request.GET.get("page"))
        context["failures"] = failed(event)
    return render(request, "console/event.html", context)


def _reports_covering(event: Event) -> str:
    """The reach report's page over the minute the event was sent in (each receiver's
    fate is there once retention dropped its deliveries from the database)."""
    start = event.published_at.replace(second=0, microsecond=0)
    return report_page_url(
        "reach", Params(window_start=start, window_end=start + timedelta(minutes=1))
    )
