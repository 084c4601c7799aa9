"""When a console session's key is renewed.

The session's key and CSRF token are renewed when the second factor is accepted: a
cookie copied before the code was typed (a password-only session) is then worth
nothing, instead of carrying the code's proof to whoever copied it.
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.middleware.csrf import get_token, rotate_token
from django_htmx.http import trigger_client_event

# The event an htmx response raises (HX-Trigger) to hand the page its renewed CSRF
# token: static/console/console.js puts it in the page's htmx headers and forms.
CSRF_RENEWED_EVENT = "csrf-renewed"


def renew_session(request: HttpRequest) -> None:
    """Give the session a new key and a new CSRF token, keeping what it holds: the
    old key opens nothing from now on, and the old token is refused."""
    request.session.cycle_key()
    rotate_token(request)
    request.csrf_token_renewed = True


class SessionRenewal:
    """An htmx request that renewed the CSRF token (a code typed in place, in a
    fragment) hands the page its new token: the page's other forms and its htmx
    headers still hold the old one, which is now refused."""

    def __init__(self, get_response) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if request.htmx and getattr(request, "csrf_token_renewed", False):
            trigger_client_event(response, CSRF_RENEWED_EVENT, {"token": get_token(request)})
        return response
