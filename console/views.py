"""The operators' pages. Views stay thin: reads come from selectors/health modules."""

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from console import health


@require_GET
@login_required
def home(request: HttpRequest) -> HttpResponse:
    """The landing page: where to go next, and a live server-time socket."""
    return render(request, "console/home.html")


@require_GET
@never_cache
@login_required
def health_page(request: HttpRequest) -> HttpResponse:
    """The health page; htmx asks for just its `checks` partial to refresh it."""
    if not request.htmx:
        return render(request, "console/health.html", {"checks": None})
    checks = health.run_all_checks()
    context = {"checks": checks, "all_ok": all(check.ok for check in checks)}
    return render(request, "console/health.html#checks", context)


@require_GET
@never_cache
def health_json(request: HttpRequest) -> JsonResponse:
    """Machine-readable health for monitors: 200 when every check passes, else 503."""
    checks = health.run_all_checks()
    all_ok = all(check.ok for check in checks)
    payload = {"ok": all_ok, "checks": [check.as_dict() for check in checks]}
    return JsonResponse(payload, status=200 if all_ok else 503)
