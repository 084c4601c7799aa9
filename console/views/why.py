"""Why / why not: why a client did or did not get an event, check by check."""

from __future__ import annotations

from uuid import UUID

from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import NoReverseMatch, reverse
from django.views.decorators.http import require_GET

from broker.reads.clients import client_named
from broker.reads.events import event_with_sender
from broker.reads.why import why
from broker.roles import READ
from console.access import requires


@require_GET
@requires(READ, action="event.why")
def why_page(request: HttpRequest, event_id: UUID, name: str) -> HttpResponse:
    """The selector, the policy (sender and content clauses) and the route, with the
    values as they were; a 404 that says which of the two is unknown."""
    event = event_with_sender(event_id)
    client = client_named(name)
    if event is None or client is None:
        missing = f"no event {event_id}" if event is None else f"no client named {name!r}"
        return render(request, "console/why.html", {"missing": missing}, status=404)
    context = {"event": event, "client": client, "found": why(event, client)}
    return render(request, "console/why.html", context)


@require_GET
@requires(READ, action="event.why")
def why_lookup(request: HttpRequest, event_id: UUID) -> HttpResponse:
    """The event page's "why did or didn't NAME get it?": to that client's why page."""
    name = request.GET.get("client", "").strip()
    try:
        return redirect(reverse("event-why", args=[event_id, name]))
    except NoReverseMatch:  # empty, or a character no client name has
        missing = f"no client named {name!r}" if name else "no client given: type its name"
        return render(request, "console/why.html", {"missing": missing}, status=404)
