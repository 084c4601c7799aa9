"""The Fleet page: every client, searched by selector, with facets and bulk actions."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, QueryDict
from django.shortcuts import render
from django.views.decorators.http import require_GET, require_POST

from broker.models import Client
from broker.reads.directory import fresh_directory
from broker.reads.presence import LAST_SEEN_BUCKETS, SIGNATURE_CHECKING
from broker.reads.search import CONNECTED, NOT_CONNECTED, FleetQuery, matching_ids, search_fleet
from broker.roles import MANAGE_CLIENTS, READ
from broker.services import clients as client_services
from console.access import actor_of, requires
from policies import PolicySyntaxError

BULK_ACTIONS = {
    "revoke_tokens": "Revoke the tokens of",
    "deactivate": "Deactivate",
    "activate": "Reactivate",
}
SHOWN_NAMES = 20
SORTABLE = (("name", "Name"), ("model", "Model"))


def fleet_query(params: QueryDict) -> FleetQuery:
    """The search as the page's parameters state it; nonsense falls back to defaults."""
    try:
        page = max(1, min(int(params.get("page", "1")), 1_000_000))
    except ValueError:
        page = 1
    return FleetQuery(
        text=params.get("q", ""),
        model=params.get("model", ""),
        order=params.get("sort", "name"),
        page=page,
        connected=_one_of(params.get("connected", ""), (CONNECTED, NOT_CONNECTED)),
        seen=_one_of(params.get("seen", ""), LAST_SEEN_BUCKETS),
        verifies=_one_of(params.get("verifies", ""), SIGNATURE_CHECKING),
    )


def _one_of(value: str, allowed) -> str:
    return value if value in allowed else ""


@require_GET
@requires(READ, action="fleet.view")
def fleet(request: HttpRequest) -> HttpResponse:
    """The fleet, or (for htmx) just its results: table, facets and paging."""
    result = search_fleet(fleet_query(request.GET))
    template = "console/fleet.html#results" if request.htmx else "console/fleet.html"
    context = {"result": result, "actions": BULK_ACTIONS, "sortable": SORTABLE}
    return render(request, template, context, status=400 if result.error else 200)


@require_POST
@requires(MANAGE_CLIENTS, action="fleet.bulk_action")
def bulk_action(request: HttpRequest) -> HttpResponse:
    """Confirm, then apply, one action to the chosen clients or to all that match."""
    action = request.POST.get("action", "")
    if action not in BULK_ACTIONS:
        return _bulk_refused(request, f"there is no bulk action {action!r}")
    try:
        clients = _chosen_clients(request.POST)
    except (ValueError, PolicySyntaxError) as error:
        return _bulk_refused(request, f"the selection is not valid: {error}")
    if not clients:
        return _bulk_refused(request, "no client is selected: tick some rows, or choose all")
    context = {"action": action, "verb": BULK_ACTIONS[action], "count": len(clients)}
    if request.POST.get("confirm") != "yes":
        context["names"] = [c.name for c in clients[:SHOWN_NAMES]]
        return render(request, "console/fleet.html#bulk-confirm", context)
    context["changed"] = _apply(action, clients, request)
    return render(request, "console/fleet.html#bulk-done", context)


def _chosen_clients(data: QueryDict) -> list[Client]:
    if data.get("scope") == "all":
        with fresh_directory() as directory:
            ids = matching_ids(directory, fleet_query(data))
    else:
        ids = {int(value) for value in data.getlist("client")}
    return list(Client.objects.filter(id__in=ids).order_by("name"))


def _apply(action: str, clients: list[Client], request: HttpRequest) -> int:
    actor = actor_of(request)
    if action == "revoke_tokens":
        return client_services.revoke_tokens_of(clients=clients, actor=actor)
    active = action == "activate"
    return client_services.set_clients_active(clients=clients, active=active, actor=actor)


def _bulk_refused(request: HttpRequest, message: str) -> HttpResponse:
    return render(request, "console/fleet.html#bulk-error", {"message": message}, status=400)
