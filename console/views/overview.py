"""The operators' pages. Views stay thin: reads come from broker.reads and console.health."""

from django.contrib.auth.decorators import login_required
from django.contrib.auth.views import redirect_to_login
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from auditchain.reads import ChainState, chain_state
from console import health, processes
from lifecycle.reads import TableRetention, retention_state


@require_GET
@login_required
def home(request: HttpRequest) -> HttpResponse:
    """The landing page: where to go next, and a live server-time socket."""
    return render(request, "console/home.html")


@require_GET
@never_cache
def health_page(request: HttpRequest) -> HttpResponse:
    """The health page (logged in); htmx asks for just its `checks` partial to refresh it.
    While the database is down, no login can be checked: the page then shows what
    /healthz.json shows anyone (each check up or down), so that it still says what is
    wrong without telling a stranger the details."""
    try:
        logged_in = request.user.is_authenticated
    except DatabaseError:
        return _public_health_checks(request, status=200 if request.htmx else 503)
    if not logged_in:
        return redirect_to_login(request.get_full_path())
    if not request.htmx:
        return render(request, "console/health.html", {"checks": None})
    return _health_checks(request)


def _health_checks(request: HttpRequest) -> HttpResponse:
    # htmx swaps only successful answers, hence 200 for it even when checks fail.
    checks = health.run_all_checks()
    context = {
        "checks": checks,
        "all_ok": all(check.ok for check in checks),
        "processes": _processes_unless_database_down(),
        "late_after_s": processes.LATE_AFTER_S,
        "audit": _audit_chain_unless_database_down(),
        "retention": _retention_unless_database_down(),
    }
    return render(request, "console/health.html#checks", context)


def _public_health_checks(request: HttpRequest, *, status: int) -> HttpResponse:
    # No latency, detail or process list: whoever asks may be anyone.
    checks = health.run_all_checks()
    context = {"checks": checks, "all_ok": all(check.ok for check in checks), "public": True}
    return render(request, "console/health.html#checks", context, status=status)


def _audit_chain_unless_database_down() -> ChainState | None:
    """The audit log's last verification (None while the database is down)."""
    try:
        return chain_state()
    except DatabaseError:
        return None


def _retention_unless_database_down() -> list[TableRetention] | None:
    """Each partitioned table's retention (None while the database is down)."""
    try:
        return retention_state()
    except DatabaseError:
        return None


def _processes_unless_database_down() -> processes.Processes:
    try:
        return processes.processes_now()
    except DatabaseError:  # the reports worker's run is read from the database
        return processes.Processes({}, 0, unknown="the database cannot be reached")


@require_GET
@never_cache
def health_json(request: HttpRequest) -> JsonResponse:
    """Health for monitors and anyone else: 200 when every check passes, else 503, and
    each check up or down by name. No versions, latencies or error texts: those name
    the servers and how they are reached, and are on the logged-in page only."""
    payload = health.public_health(health.run_all_checks())
    return JsonResponse(payload, status=200 if payload["ok"] else 503)
