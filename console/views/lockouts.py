"""The Sign-in page (the admin's): usernames and addresses refused at login for too
many failures, and lifting them; every user's second factor, and resetting one."""

from __future__ import annotations

from django.conf import settings
from django.contrib import messages
from django.contrib.auth import get_user_model
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from broker.errors import BrokerError
from broker.reads.operators import current_lockouts, second_factors
from broker.roles import MANAGE_ACCOUNTS
from broker.services.operators import lift_lockout, reset_second_factor
from console.access import actor_of, requires, requires_fresh_code


@require_GET
@requires(MANAGE_ACCOUNTS, action="lockouts.view")
def lockouts(request: HttpRequest) -> HttpResponse:
    """Every current lockout, latest first, each with a button that lifts it."""
    context = {
        "lockouts": current_lockouts(),
        "failure_limit": settings.AXES_FAILURE_LIMIT,
        "factors": second_factors(),
        "enrol_days": settings.SECOND_FACTOR_ENROL_DAYS,
    }
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


@require_POST
@requires(MANAGE_ACCOUNTS, action="operator.reset_second_factor")
@requires_fresh_code
def reset_factor(request: HttpRequest) -> HttpResponse:
    """Remove a user's authenticator and recovery codes (a lost phone): they enrol a new
    one at their next login. Taking over an account this way needs a fresh code."""
    user = get_user_model().objects.filter(username=request.POST.get("username", "")).first()
    if user is None:
        messages.error(request, "No such user.")
    else:
        reset_second_factor(user=user, actor=actor_of(request))
        messages.success(request, f"Reset the second factor of {user.username}: they enrol anew.")
    return redirect("lockouts")
