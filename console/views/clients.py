"""The Client page: attributes with provenance, policy history, tokens, deliveries."""

from __future__ import annotations

from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from broker import selectors
from broker.models import Client
from broker.services import clients as client_services
from console.access import actor_of, requires
from console.diffs import policy_diff
from console.roles import MANAGE_CLIENTS, READ


def _client_or_404(name: str) -> Client:
    client = selectors.client_named(name)
    if client is None:
        raise Http404(f"no client named {name!r}")
    return client


@require_GET
@requires(READ, action="client.view")
def client_page(request: HttpRequest, name: str) -> HttpResponse:
    """Everything about one client; `?diff=N` compares policy version N with N-1."""
    client = _client_or_404(name)
    versions = selectors.policy_history(client)
    presence = selectors.presence_of(client)
    context = {
        "presence": presence,
        "connected": selectors.is_connected(presence, timezone.now()),
        "client": client,
        "declared": list(client.model.attributes.order_by("name")),
        "values": selectors.attribute_provenance(client),
        "versions": versions,
        "diff": _chosen_diff(versions, request.GET.get("diff", "")),
        "tokens": list(client.tokens.order_by("-created_at")[:50]),
        "grants": list(client.grants.select_related("authority").order_by("-created_at")),
        "deliveries": selectors.recent_deliveries(client),
        "stream": selectors.stream_of(client),
    }
    return render(request, "console/client.html", context)


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
    return render(request, "console/client.html#tokens", context)
