"""How long a console session lasts, and when its key is renewed.

A session of a role that changes anything (broker.roles.needs_second_factor) ends
SESSION_IDLE_MIN minutes after its last activity, and SESSION_MAX_HOURS after its
login however active: its next request logs the user out (audited) and goes to the
login page, which says why. Requests a page makes by itself are not activity, or a
page left open would never idle out. The auditor's sessions keep Django's cookie age.

The session's key and CSRF token are renewed when the second factor is accepted, and
at the first request after the user's roles changed: a cookie copied before either
(a password-only session, a session of lesser roles) is then worth nothing, instead of
carrying the code's proof, or the new roles, to whoever copied it.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from django.conf import settings
from django.contrib import messages
from django.contrib.auth import logout
from django.contrib.auth.views import redirect_to_login
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse
from django.middleware.csrf import get_token, rotate_token
from django.shortcuts import redirect, resolve_url
from django_htmx.http import HttpResponseClientRedirect, trigger_client_event

from broker.roles import needs_second_factor

API_PREFIX = "/api/"  # bearer tokens, no session
# When the session's user logged in, and when they last acted (Unix times).
STARTED_AT = "session_started_at"
ACTIVE_AT = "session_active_at"
# Activity is written into the session at most this often: a write at every request
# would cost each fragment an UPDATE, for a limit counted in minutes.
ACTIVITY_STEP_S = 60
# Requests a page makes by itself carry this header (static/console/console.js, the
# health page's poll): they are not activity.
AUTO_REFRESH_HEADER = "X-Auto-Refresh"
IDLE, LIFETIME = "idle", "lifetime"
# What the session's user could do when it was last seen (roles_seal).
ROLES_SEEN = "session_roles"
# The event an htmx response raises (HX-Trigger) to hand the page its renewed CSRF
# token: static/console/console.js puts it in the page's htmx headers and forms.
CSRF_RENEWED_EVENT = "csrf-renewed"


def now() -> float:
    """The clock sessions are timed by (a Unix time); the tests move it."""
    return time.time()


@dataclass(frozen=True)
class SessionEnd:
    """When a session ends (a Unix time), and why: IDLE or LIFETIME."""

    reason: str
    at: float

    @property
    def message(self) -> str:
        """What the login page says about it."""
        if self.reason == IDLE:
            idle = _count(settings.SESSION_IDLE_MIN, "minute")
            return f"Your session ended after {idle} without activity; log in again."
        lifetime = _count(settings.SESSION_MAX_HOURS, "hour")
        return f"Your session ended: sessions last at most {lifetime}; log in again."

    def audit_details(self) -> dict:
        """What the audit entry of the logout keeps of it."""
        if self.reason == IDLE:
            limit = f"{settings.SESSION_IDLE_MIN} min idle"
        else:
            limit = f"{settings.SESSION_MAX_HOURS} h in all"
        ended_at = datetime.fromtimestamp(self.at, UTC).isoformat(timespec="seconds")
        return {"reason": self.reason, "limit": limit, "ended_at": ended_at}


def _count(number: int, unit: str) -> str:
    return f"{number} {unit}{'' if number == 1 else 's'}"


def session_end(session: Mapping, user) -> SessionEnd | None:
    """When `user`'s `session` ends: SESSION_IDLE_MIN after its last activity or
    SESSION_MAX_HOURS after its login, whichever comes first. None for a role that
    changes nothing (the auditor keeps Django's cookie age), or a session not timed
    yet (its first request times it)."""
    started, active = session.get(STARTED_AT), session.get(ACTIVE_AT)
    if started is None or active is None or not needs_second_factor(user):
        return None
    idle = SessionEnd(IDLE, active + settings.SESSION_IDLE_MIN * 60)
    lifetime = SessionEnd(LIFETIME, started + settings.SESSION_MAX_HOURS * 3600)
    return min(idle, lifetime, key=lambda end: end.at)


def renew_session(request: HttpRequest) -> None:
    """Give the session a new key and a new CSRF token, keeping what it holds: the
    old key opens nothing from now on, and the old token is refused."""
    request.session.cycle_key()
    rotate_token(request)
    request.csrf_token_renewed = True


def roles_seal(user) -> str:
    """A digest of what `user` may do: their permissions (from their groups, and
    their own), staff and superuser. It changes with their roles. The permissions
    are those the request loads anyway to check the second factor: no query more."""
    granted = ["superuser"] if user.is_superuser else sorted(user.get_all_permissions())
    text = "\n".join([f"staff={user.is_staff}", *granted])
    return hashlib.sha256(text.encode()).hexdigest()[:32]


class SessionRenewal:
    """Renews the session's key and CSRF token at the first request after the user's
    roles changed (a session copied while they held less must not gain what they were
    granted since). An htmx request that renewed the token, here or in its view (a
    code typed in place), hands the page its new token: the page's other forms and
    its htmx headers still hold the old one, which is now refused."""

    def __init__(self, get_response) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if not request.path.startswith(API_PREFIX):
            _renew_if_roles_changed(request)
        response = self.get_response(request)
        if request.htmx and getattr(request, "csrf_token_renewed", False):
            trigger_client_event(response, CSRF_RENEWED_EVENT, {"token": get_token(request)})
        return response


def _renew_if_roles_changed(request: HttpRequest) -> None:
    try:
        if not request.user.is_authenticated:
            return
        seal, seen = roles_seal(request.user), request.session.get(ROLES_SEEN)
    except DatabaseError:
        return  # PostgreSQL is down: nothing can act (console.middleware.RequireSecondFactor)
    if seal == seen:
        return
    if seen is not None:
        renew_session(request)
    request.session[ROLES_SEEN] = seal


class EndSessions:
    """Logs out the user of a session that has ended (session_end), audited as
    `console.session_end`, and sends them to the login page, which says why; an htmx
    request gets HX-Redirect there, not a login form swapped into its fragment. Each
    other request is the user's activity, unless the page made it by itself."""

    def __init__(self, get_response) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.path.startswith(API_PREFIX):
            return self.get_response(request)
        ended = _ended(request)
        if ended is not None:
            _log_out(request, ended)
            if request.path != _login_page():
                return _to_login(request)
        response = self.get_response(request)
        _note_activity(request)
        return _as_client_redirect(request, response)


def _ended(request: HttpRequest) -> SessionEnd | None:
    """How the request's session ended, if it has."""
    try:
        if not request.user.is_authenticated:
            return None
        end = session_end(request.session, request.user)
    except DatabaseError:
        return None  # PostgreSQL is down: nothing can act (console.middleware)
    return end if end is not None and end.at <= now() else None


def _log_out(request: HttpRequest, end: SessionEnd) -> None:
    # console/signals.py audits this logout as the session's end, with `end`.
    request.session_ended = end
    logout(request)
    if not (request.method == "POST" and request.path == _login_page()):
        messages.info(request, end.message)  # not to someone logging in again


def _to_login(request: HttpRequest) -> HttpResponse:
    """To the login page, coming back to the page the request came from."""
    if request.htmx:
        page = request.htmx.current_url_abs_path
        return HttpResponseClientRedirect(redirect_to_login(page).url if page else _login_page())
    if request.method == "GET":
        return redirect_to_login(request.get_full_path())
    return redirect(_login_page())


def _login_page() -> str:
    return resolve_url(settings.LOGIN_URL)


def _note_activity(request: HttpRequest) -> None:
    """Time a session from its login, and note the activity of an acting role's user
    in it (at most every ACTIVITY_STEP_S); a request the page made by itself is not
    activity. The auditor's session is left as it is, to Django's cookie age."""
    try:
        if not request.user.is_authenticated:
            return
        acting = needs_second_factor(request.user)
    except DatabaseError:
        return
    session, at = request.session, now()
    session.setdefault(STARTED_AT, at)
    if not acting:
        session.pop(ACTIVE_AT, None)  # timed anew from its first request as an acting role
    elif ACTIVE_AT not in session or _is_activity(request, since=session[ACTIVE_AT]):
        session[ACTIVE_AT] = at


def _is_activity(request: HttpRequest, *, since: float) -> bool:
    """Whether the request is the user's own, at least ACTIVITY_STEP_S after `since`."""
    by_the_page = request.headers.get(AUTO_REFRESH_HEADER) == "1"
    return not by_the_page and now() - since >= ACTIVITY_STEP_S


def _as_client_redirect(request: HttpRequest, response: HttpResponse) -> HttpResponse:
    """An htmx request sent to the login page (its session ended, or was logged out,
    in another tab) is sent there with HX-Redirect, as a whole page."""
    if not request.htmx or response.status_code != 302:
        return response
    if response["Location"].split("?")[0] != _login_page():
        return response
    return _to_login(request)
