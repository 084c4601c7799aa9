"""The Lockouts page: usernames and addresses refused at login for too many failures,
and lifting them (the admin's)."""

from __future__ import annotations

from django.conf import settings
from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from broker.errors import BrokerError
from broker.reads.operators import current_lockouts
from broker.roles import MANAGE_ACCOUNTS
from broker.services.operators import lift_lockout
from console.access import actor_of, requires


@require_GET
@requires(MANAGE_ACCOUNTS, action="lockouts.view")
def lockouts(request: HttpRequest) -> HttpResponse:
    """Every current lockout, latest first, each with a button that lifts it."""
    context = {"lockouts": current_lockouts(), "failure_limit": settings.AXES_FAILURE_LIMIT}
    return render(request, "console/lockouts.html", context)


@require_POST
@requires(MANAGE_ACCOUNTS, action="console.lift_lockout")
def lift(request: HttpRequest) -> HttpResponse:
    """Lift the lockout of the username or address posted (kind and value)."""
    kind, value = request.POST.get("kind", ""), request.POST.get("value", "")
    try:
        removed = lift_lockout(kind=kind, value=value, actor=actor_of(request))
    except BrokerError as error:
        messages.error(request, error.message)
    else:
        messages.success(request, f"Lifted the lockout of {kind} {value} ({removed} attempts).")
    return redirect("lockouts")
