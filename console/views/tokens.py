"""The API tokens page: every client's and operator's token with when it was issued,
when it expires and when it was last used; revoking one."""

from __future__ import annotations

from django.conf import settings
from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_POST

from broker.models import ClientToken, OperatorToken
from broker.reads.tokens import CLIENT, OPERATOR, ORDERS, TokenQuery, token_page
from broker.roles import MANAGE_ACCOUNTS, MANAGE_CLIENTS, READ
from broker.services.clients import revoke_token
from broker.services.operators import revoke_operator_token
from console.access import actor_of, refuse, requires


@require_GET
@requires(READ, action="tokens.view")
def tokens(request: HttpRequest) -> HttpResponse:
    """Live tokens (or all, `?state=all`), sorted and paged on the server; operators'
    tokens are everyone's for an admin, one's own for anyone else."""
    query = TokenQuery.from_params(request.GET, operator_tokens_of=_whose(request))
    context = {
        "page": token_page(query),
        "query": query,
        "orders": list(ORDERS),
        "client_days": settings.CLIENT_TOKEN_DAYS,
        "operator_days": settings.OPERATOR_TOKEN_DAYS,
    }
    return render(request, "console/tokens.html", context)


def _whose(request: HttpRequest) -> int | None:
    return None if request.user.has_perm(MANAGE_ACCOUNTS) else request.user.pk


@require_POST
@requires(READ, action="tokens.revoke")
def revoke(request: HttpRequest) -> HttpResponse:
    """Revoke the token posted (`kind`, `id`): a client's needs the client managers'
    permission; an operator's is its owner's or the admin's to revoke."""
    kind, token_id = request.POST.get("kind"), request.POST.get("id", "")
    if kind not in (CLIENT, OPERATOR) or not token_id.isdigit():
        messages.error(request, "Say which token: kind client or operator, and its id.")
        return redirect("tokens")
    if kind == CLIENT:
        return _revoke_client_token(request, int(token_id))
    return _revoke_operator_token(request, int(token_id))


def _revoke_client_token(request: HttpRequest, token_id: int) -> HttpResponse:
    if not request.user.has_perm(MANAGE_CLIENTS):
        return refuse(request, permission=MANAGE_CLIENTS, action="client.revoke_token")
    token = get_object_or_404(ClientToken.objects.select_related("client"), pk=token_id)
    revoke_token(token=token, actor=actor_of(request))
    messages.success(request, f"Revoked token {token.pk} of {token.client.name}.")
    return redirect("tokens")


def _revoke_operator_token(request: HttpRequest, token_id: int) -> HttpResponse:
    token = get_object_or_404(OperatorToken.objects.select_related("user"), pk=token_id)
    if token.user_id != request.user.pk and not request.user.has_perm(MANAGE_ACCOUNTS):
        return refuse(request, permission=MANAGE_ACCOUNTS, action="operator.revoke_token")
    revoke_operator_token(token=token, actor=actor_of(request))
    messages.success(request, f"Revoked {token.user.username}'s token {token.label!r}.")
    return redirect("tokens")
