"""The second factor: enrolling an authenticator (a QR code drawn here, recovery codes
shown once), typing a code after the password, and again before acting when the last
code is older than SECOND_FACTOR_FRESH_MIN."""

from __future__ import annotations

from base64 import b32encode

import segno
from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_http_methods, require_POST
from django_otp import login as otp_login

from broker import audit
from broker.errors import BrokerError
from broker.reads.operators import has_second_factor, may_enrol, recovery_codes_left
from broker.services.operators import check_second_factor, confirm_enrolment, enrolment_device
from console.access import actor_of, note_code_typed
from console.sessions import renew_session

TEMPLATE = "console/second_factor.html"


@login_required
@require_http_methods(["GET", "POST"])
def second_factor(request: HttpRequest) -> HttpResponse:
    """Type a code (or enrol an authenticator first, if none is), then go on to `next`."""
    if not has_second_factor(request.user):
        return _enrol(request)
    if request.method == "GET":
        return render(request, TEMPLATE, _verify_context(request))
    try:
        device = check_second_factor(
            user=request.user, code=request.POST.get("code", ""), actor=actor_of(request)
        )
    except BrokerError as error:
        return render(request, TEMPLATE, {**_verify_context(request), "problem": error}, status=403)
    _proved(request, device)
    return redirect(_next_page(request))


def _verify_context(request: HttpRequest) -> dict:
    return {
        "next": _next_page(request),
        "again": request.GET.get("again") == "1" or request.user.is_verified(),
        "codes_left": recovery_codes_left(request.user),
    }


def _enrol(request: HttpRequest) -> HttpResponse:
    """Show the authenticator to enrol; a code from it confirms it (and logs in).
    Once enrolment has closed, say so: only an admin opens it again."""
    if not may_enrol(request.user):
        return _enrolment_closed(request)
    device = enrolment_device(user=request.user)
    context = {"enrolling": True, "next": _next_page(request), **_qr_code(device)}
    if request.method == "GET":
        return render(request, TEMPLATE, context)
    try:
        device, codes = confirm_enrolment(
            user=request.user, code=request.POST.get("code", ""), actor=actor_of(request)
        )
    except BrokerError as error:
        return render(request, TEMPLATE, {**context, "problem": error}, status=403)
    _proved(request, device)
    return render(request, TEMPLATE, {"recovery_codes": codes, "next": context["next"]})


def _enrolment_closed(request: HttpRequest) -> HttpResponse:
    audit.record_refusal(
        actor=actor_of(request),
        action="operator.enrol_second_factor",
        target=f"user:{request.user.username}",
        reason="enrolment is closed: ask an admin to open it",
    )
    context = {"closed": True, "enrol_days": settings.SECOND_FACTOR_ENROL_DAYS}
    return render(request, TEMPLATE, context, status=403)


def _qr_code(device) -> dict:
    """The device's otpauth:// address as an SVG QR code, and its key to type instead."""
    qr = segno.make(device.config_url, error="m")
    secret = b32encode(device.bin_key).decode().rstrip("=")
    return {"qr_svg": qr.svg_inline(scale=5, dark="#111"), "secret": secret}


def _proved(request: HttpRequest, device) -> None:
    """Mark the session as proved by `device` just now, under a new key and CSRF
    token: a cookie copied before the code (the password alone) must not inherit it."""
    otp_login(request, device)
    note_code_typed(request)
    renew_session(request)


def _next_page(request: HttpRequest) -> str:
    wanted = request.POST.get("next") or request.GET.get("next") or "/"
    safe = url_has_allowed_host_and_scheme(wanted, allowed_hosts={request.get_host()})
    return wanted if safe and wanted.startswith("/") else "/"


@login_required
@require_POST
def confirm_again(request: HttpRequest) -> HttpResponse:
    """A fresh code for the action refused a moment ago (an htmx fragment): the
    operator then presses its button again (the page gets the renewed CSRF token
    from console.sessions.SessionRenewal)."""
    try:
        device = check_second_factor(
            user=request.user, code=request.POST.get("code", ""), actor=actor_of(request)
        )
    except BrokerError as error:
        context = {"problem": error, "fresh_min": settings.SECOND_FACTOR_FRESH_MIN}
        return render(request, f"{TEMPLATE}#again", context, status=403)
    _proved(request, device)
    return render(request, f"{TEMPLATE}#again", {"confirmed": True})
