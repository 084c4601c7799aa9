"""The Client page: attributes with provenance, policy history, tokens, deliveries."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from broker import selectors
from broker.errors import BrokerError
from broker.models import Client
from broker.services import clients as client_services
from broker.services.sending import grant_sending, withdraw_sending
from console.access import actor_of, requires
from console.diffs import policy_diff
from console.roles import DELEGATE_SENDING, MANAGE_CLIENTS, READ


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
        **_sending_context(client),
    }
    return render(request, "console/client.html", context)


def _sending_context(client: Client) -> dict:
    """Who may send as a sender client, and whom it could be granted to."""
    if not client.can_send:
        return {}
    return {
        "holders": selectors.sending_holders(client),
        "candidates": [
            f"group:{g}" for g in Group.objects.order_by("name").values_list("name", flat=True)
        ]
        + [
            f"user:{u}"
            for u in get_user_model()
            .objects.order_by("username")
            .values_list("username", flat=True)[:200]
        ],
    }


@require_POST
@requires(DELEGATE_SENDING, action="client.sending")
def sending(request: HttpRequest, name: str) -> HttpResponse:
    """Let a user or a role send as this client, or stop them (audited)."""
    client = _client_or_404(name)
    change = {"grant": grant_sending, "withdraw": withdraw_sending}.get(request.POST.get("do"))
    holder = _holder(request.POST.get("holder", ""))
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


def _holder(text: str):
    """The group or user a "group:NAME" / "user:NAME" names, or None."""
    kind, _, name = text.partition(":")
    if kind == "group":
        return Group.objects.filter(name=name).first()
    if kind == "user":
        return get_user_model().objects.filter(username=name).first()
    return None


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
