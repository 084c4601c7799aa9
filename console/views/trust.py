"""The Trust page: authorities, their capabilities and keys, the grants clients gave
them; attest, renew and revoke for one client or many by selector."""

from __future__ import annotations

from django.db.models import Count, Q
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from broker.models import Authority
from console.access import requires
from console.roles import READ


@require_GET
@requires(READ, action="trust.view")
def trust_page(request: HttpRequest) -> HttpResponse:
    """Every authority with what it may attest and how many clients granted it."""
    live_grants = Count("grants", filter=Q(grants__revoked_at__isnull=True), distinct=True)
    authorities = (
        Authority.objects.annotate(live_grants=live_grants)
        .prefetch_related("capabilities__model")
        .order_by("name")
    )
    context = {"authorities": authorities, "selector": request.GET.get("selector", "")}
    return render(request, "console/trust.html", context)
