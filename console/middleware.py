"""Refusing, before any view, console requests whose text cannot be stored; closing a
request's database connections after it; spelling out invisible characters in pages."""

from __future__ import annotations

from django.db import DatabaseError, connections
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django_htmx.http import HttpResponseClientRedirect

from broker.errors import InvalidInput
from broker.inputs import INVISIBLE, check_text, reveal_invisible
from console.access import has_fresh_code, lacks_second_factor, second_factor_url

API_PREFIX = "/api/"  # the API refuses such input itself, as JSON


class RefuseUnstorableText:
    """A page's parameters or path holding NUL (or a lone surrogate) is answered 400
    with what is wrong and where, instead of failing in PostgreSQL later (a 500)."""

    def __init__(self, get_response) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if not request.path.startswith(API_PREFIX):
            try:
                _check_request(request)
            except InvalidInput as error:
                return HttpResponse(error.message, status=400, content_type="text/plain")
        return self.get_response(request)


def _check_request(request: HttpRequest) -> None:
    check_text(request.path, "the address")
    for where in (request.GET, request.POST):
        for key, values in where.lists():
            check_text(key, "a field's name")
            for value in values:
                check_text(value, key)


class CloseDatabaseConnections:
    """Closes the database connections a request opened once its response is built.

    Under ASGI a request's view runs in a context of its own, and Django's own closing
    at the end of the request (the `request_finished` signal) runs in another one that
    never sees those connections (Django ticket #33497). Kept for reuse, they would
    never be reused: each waited for the garbage collector to close it, and with the
    collector tuned for the server processes (console/runtime.py) PostgreSQL ran out of
    connections. A connection inside a transaction is left alone: that is a test's.
    """

    def __init__(self, get_response) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        try:
            return self.get_response(request)
        finally:
            for connection in connections.all(initialized_only=True):
                if not connection.in_atomic_block:
                    connection.close()


class RevealInvisibleCharacters:
    """Every invisible character in an HTML page or fragment is shown as ⟨U+202E⟩
    (broker.inputs.INVISIBLE): a right-to-left override in an event's content, a
    zero-width space in a client's name or a policy would otherwise make the page read
    differently from what the service acts on. The templates hold none, so each one
    came from data. Text posted back from a form so shown holds the visible spelling."""

    def __init__(self, get_response) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if response.streaming or not response.get("Content-Type", "").startswith("text/html"):
            return response
        text = response.content.decode(response.charset)
        if INVISIBLE.search(text):
            response.content = reveal_invisible(text).encode(response.charset)
            if response.has_header("Content-Length"):
                response["Content-Length"] = str(len(response.content))
        return response


# Reachable before the second factor: proving it, leaving, and what needs no session.
BEFORE_SECOND_FACTOR = ("/account/second-factor/", "/logout/", "/login/", "/static/", API_PREFIX)
# Django's admin pages that grant roles and permissions (users and groups).
GRANTS_IN_THE_ADMIN = "/admin/auth/"


class RequireSecondFactor:
    """A logged-in user whose roles change anything reaches no page, fragment or form
    until they typed a code of their second factor (enrolling one first if they have
    none): a stolen or guessed password alone acts on nothing. Granting roles in
    Django's admin also needs a fresh code."""

    def __init__(self, get_response) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.path.startswith(BEFORE_SECOND_FACTOR):
            # The pages reachable before it show no navigation and open no socket.
            request.second_factor_pending = _pending(request)
            return self.get_response(request)
        try:
            refused = _second_factor_refusal(request)
        except DatabaseError:
            # PostgreSQL is down: nothing can act, and the health page says so without
            # the login it cannot check (console/views/overview.py).
            return self.get_response(request)
        return refused or self.get_response(request)


def _pending(request: HttpRequest) -> bool:
    try:
        return request.user.is_authenticated and lacks_second_factor(request)
    except DatabaseError:
        return False


def _second_factor_refusal(request: HttpRequest) -> HttpResponse | None:
    """Where the request must go first, if its session lacks a (fresh) second factor."""
    if not request.user.is_authenticated:
        return None
    if lacks_second_factor(request):
        return _to_second_factor(request, again=False)
    granting = request.method == "POST" and request.path.startswith(GRANTS_IN_THE_ADMIN)
    if granting and not has_fresh_code(request):
        return _to_second_factor(request, again=True)
    return None


def _to_second_factor(request: HttpRequest, *, again: bool) -> HttpResponse:
    """To the second factor's page, coming back here (a GET) once it is proved."""
    back = request.get_full_path() if request.method == "GET" else request.path
    url = second_factor_url(next_page=back, again=again)
    return HttpResponseClientRedirect(url) if request.htmx else redirect(url)
