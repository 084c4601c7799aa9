"""The Client page: attributes with provenance, policy history, tokens, deliveries,
and the way to ask why it did or did not get an event."""

from __future__ import annotations

from uuid import UUID

from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST
from django_htmx.http import HttpResponseClientRedirect

from broker.errors import BrokerError
from broker.models import Client
from broker.reads.clients import attribute_provenance, client_named
from broker.reads.deliveries import delivery_states, recent_deliveries, stream_of
from broker.reads.events import event_with_sender
from broker.reads.history import policy_history
from broker.reads.presence import is_connected, presence_of, verifies_signatures
from broker.reads.progress import recent_events
from broker.reads.sending import sending_candidates, sending_holder, sending_holders
from broker.roles import DELEGATE_SENDING, MANAGE_CLIENTS, READ
from broker.services import clients as client_services
from broker.services.sending import grant_sending, withdraw_sending
from console.access import actor_of, requires, requires_fresh_code
from console.diffs import policy_diff


def _client_or_404(name: str) -> Client:
    client = client_named(name)
    if client is None:
        raise Http404(f"no client named {name!r}")
    return client


@require_GET
@requires(READ, action="client.view")
def client_page(request: HttpRequest, name: str) -> HttpResponse:
    """Everything about one client; `?diff=N` compares policy version N with N-1."""
    client = _client_or_404(name)
    return render(request, "console/client.html", _page_context(request, client))


def _page_context(request: HttpRequest, client: Client) -> dict:
    versions = policy_history(client)
    presence = presence_of(client)
    return {
        "presence": presence,
        "connected": is_connected(presence, timezone.now()),
        "verifies": verifies_signatures(presence.acts_on if presence else ""),
        "now": timezone.now(),
        "client": client,
        "declared": list(client.model.attributes.order_by("name")),
        "values": attribute_provenance(client),
        "versions": versions,
        "diff": _chosen_diff(versions, request.GET.get("diff", "")),
        "tokens": list(client.tokens.order_by("-created_at")[:50]),
        "grants": list(client.grants.select_related("authority").order_by("-created_at")),
        "deliveries": recent_deliveries(client),
        "stream": stream_of(client),
        **_sending_context(client),
        **_newest_events(client),
    }


NEWEST_EVENTS = 10


def _newest_events(client: Client) -> dict:
    """The newest events, whoever they were for, and which of them the client got."""
    events = list(recent_events()[:NEWEST_EVENTS])
    got = delivery_states(client, events)
    return {"newest_events": [(event, got.get(event.pk)) for event in events]}


@require_GET
@requires(READ, action="event.why")
def why_form(request: HttpRequest, name: str) -> HttpResponse:
    """Go to the explanation of whether the client got the event given by its id;
    an id that is not one, or of no event, is said in place of the form."""
    client = _client_or_404(name)
    given = request.GET.get("event", "").strip()
    event_id = _uuid(given)
    if event_id is None:
        return _why_refused(request, client, given, f"{_shown(given)} is not an event id.", 400)
    if event_with_sender(event_id) is None:
        return _why_refused(request, client, given, f"There is no event {event_id}.", 404)
    url = reverse("event-why", args=[event_id, client.name])
    return HttpResponseClientRedirect(url) if request.htmx else redirect(url)


def _uuid(given: str) -> UUID | None:
    try:
        return UUID(given)
    except ValueError:
        return None


def _shown(given: str) -> str:
    return repr(given[:80]) if given else "Nothing"


def _why_refused(
    request: HttpRequest, client: Client, given: str, error: str, status: int
) -> HttpResponse:
    """The form again, saying what is wrong: alone for htmx, else in the whole page."""
    context = {"client": client, "why_error": error, "why_given": given}
    if request.htmx:
        return render(request, "console/client.html#why-form", context, status=status)
    context = {**_page_context(request, client), **context}
    return render(request, "console/client.html", context, status=status)


def _sending_context(client: Client) -> dict:
    """Who may send as a sender client, and whom it could be granted to."""
    if not client.can_send:
        return {}
    return {
        "holders": sending_holders(client),
        "candidates": sending_candidates(),
    }


@require_POST
@requires(DELEGATE_SENDING, action="client.sending")
@requires_fresh_code
def sending(request: HttpRequest, name: str) -> HttpResponse:
    """Let a user or a role send as this client, or stop them (audited)."""
    client = _client_or_404(name)
    change = {"grant": grant_sending, "withdraw": withdraw_sending}.get(request.POST.get("do"))
    holder = sending_holder(request.POST.get("holder", ""))
    if change is None or holder is None:
        problem = "Say what to do (grant or withdraw) and for whom: group:NAME or user:NAME."
        context = {"client": client, "problem": problem, **_sending_context(client)}
        return render(request, "console/client.html#sending", context, status=400)
    try:
        change(client=client, holder=holder, actor=actor_of(request))
    except BrokerError as error:
        context = {"client": client, "problem": error.message, **_sending_context(client)}
        return render(request, "console/client.html#sending", context, status=400)
    context = {"client": client, **_sending_context(client)}
    return render(request, "console/client.html#sending", context)


def _chosen_diff(versions: list, asked: str) -> dict | None:
    """The diff of one version against the one before it (the newest by default)."""
    by_number = {v.version: v for v in versions}
    chosen = by_number.get(int(asked)) if asked.isdigit() else (versions[0] if versions else None)
    if chosen is None:
        return None
    before = by_number.get(chosen.version - 1)
    old_text = before.text if before else ""
    return {"version": chosen, "before": before, "lines": policy_diff(old_text, chosen.text)}


@require_POST
@requires(MANAGE_CLIENTS, action="client.tokens")
def tokens(request: HttpRequest, name: str) -> HttpResponse:
    """Issue a token (shown once) or revoke them all; answers the tokens partial."""
    client = _client_or_404(name)
    actor = actor_of(request)
    context = {"client": client}
    if request.POST.get("do") == "issue":
        context["new_token"] = client_services.issue_token(client=client, actor=actor)
    elif request.POST.get("do") == "revoke":
        context["revoked"] = client_services.revoke_tokens(client=client, actor=actor)
    else:
        return HttpResponse("Say what to do: issue or revoke.", status=400)
    context["tokens"] = list(client.tokens.order_by("-created_at")[:50])
    context["now"] = timezone.now()
    return render(request, "console/client.html#tokens", context)
