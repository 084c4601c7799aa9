"""`/metrics`: the console's figures in Prometheus' text format, for a monitoring
system holding an operator API token (`manage.py issue_api_token`) whose role may read
the fleet; refused to anyone else (docs/console.md, "Metrics")."""

from __future__ import annotations

from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST

from broker.api import LockedOut, OperatorToken, operator_with
from broker.errors import AuthenticationFailed, NotAuthorised
from broker.roles import READ
from console import metrics as figures

BEARER = 'Bearer realm="metrics"'


@require_GET
@never_cache
def metrics(request: HttpRequest) -> HttpResponse:
    """The figures, or 401 (no valid token), 403 (a role that may not read the
    fleet), 429 (too many unknown tokens from this address) or 503 (the database is
    down)."""
    try:
        return _figures_for_a_reader(request)
    except DatabaseError:  # no token can be checked, nor deliveries counted
        return _refusal("the database cannot be reached; try again later", 503)


def _figures_for_a_reader(request: HttpRequest) -> HttpResponse:
    try:
        request.auth = OperatorToken()(request)
        if request.auth is None:
            raise AuthenticationFailed("an operator API token is required: Bearer sno_...")
        operator_with(request, READ, "metrics.read", "/metrics")
    except LockedOut as error:
        return _refusal(error.message, 429)
    except AuthenticationFailed as error:
        return _refusal(error.message, 401, {"WWW-Authenticate": BEARER})
    except NotAuthorised as error:
        return _refusal(error.message, 403)
    return HttpResponse(figures.exposition(), content_type=CONTENT_TYPE_LATEST)


def _refusal(message: str, status: int, headers: dict | None = None) -> HttpResponse:
    return HttpResponse(message + "\n", status=status, content_type="text/plain", headers=headers)
