"""When a console session's key is renewed.

The session's key and CSRF token are renewed when the second factor is accepted, and
at the first request after the user's roles changed: a cookie copied before either
(a password-only session, a session of lesser roles) is then worth nothing, instead of
carrying the code's proof, or the new roles, to whoever copied it.
"""

from __future__ import annotations

import hashlib

from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse
from django.middleware.csrf import get_token, rotate_token
from django_htmx.http import trigger_client_event

API_PREFIX = "/api/"  # bearer tokens, no session
# What the session's user could do when it was last seen (roles_seal).
ROLES_SEEN = "session_roles"
# The event an htmx response raises (HX-Trigger) to hand the page its renewed CSRF
# token: static/console/console.js puts it in the page's htmx headers and forms.
CSRF_RENEWED_EVENT = "csrf-renewed"


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
