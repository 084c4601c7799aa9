"""The Trust page: authorities, their capabilities and keys, the grants clients gave
them; attest, renew and revoke for one client or many by selector, previewed first."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.http import HttpRequest, HttpResponse, QueryDict
from django.shortcuts import get_object_or_404, render
from django.views.decorators.http import require_GET, require_POST

from broker.errors import BrokerError
from broker.models import Authority, Client
from broker.reads.search import receivers_chosen
from broker.reads.trust import authorities_overview
from broker.roles import ATTEST, MANAGE_AUTHORITIES, READ
from broker.services import authorities as authority_services
from broker.services import trust
from console.access import actor_of, requires, requires_fresh_code
from policies import PolicySyntaxError

TEMPLATE = "console/trust.html"
OPERATIONS = {trust.ATTEST: "Attest", trust.RENEW: "Renew", trust.REVOKE: "Revoke"}
SHOWN_CHANGES = 30


@require_GET
@requires(READ, action="trust.view")
def trust_page(request: HttpRequest) -> HttpResponse:
    """Every authority with what it may attest, and the attestation form."""
    context = {
        "authorities": authorities_overview(),
        "form": TrustForm(selector=request.GET.get("selector", "")),
        "operations": OPERATIONS,
    }
    return render(request, TEMPLATE, context)


@dataclass
class TrustForm:
    """An attestation, renewal or revocation as the officer typed it, read strictly."""

    authority: str = ""
    selector: str = ""
    client: str = ""
    operation: str = trust.ATTEST
    values_text: str = ""
    names_text: str = ""
    expires_text: str = ""
    problems: list[str] = field(default_factory=list)

    @classmethod
    def from_post(cls, data: QueryDict) -> TrustForm:
        keys = ("authority", "selector", "client", "operation")
        form = cls(**{key: data.get(key, "").strip() for key in keys})
        form.values_text = data.get("values", "")
        form.names_text = data.get("names", "")
        form.expires_text = data.get("expires_at", "").strip()
        return form

    def values(self) -> dict[str, Any]:
        """`name = value` lines; a value is JSON (2, true, "text") or else plain text."""
        values = {}
        for number, line in enumerate(self.values_text.splitlines(), start=1):
            if not line.strip():
                continue
            name, equals, text = line.partition("=")
            if not equals or not name.strip():
                raise ValueError(f"values, line {number}: write name = value")
            values[name.strip()] = _literal(text.strip())
        return values

    def names(self) -> list[str]:
        """Attribute names, separated by commas or spaces."""
        return [name for name in self.names_text.replace(",", " ").split() if name]

    def expires_at(self) -> datetime | None:
        """The expiry, read as UTC; None when left empty."""
        if not self.expires_text:
            return None
        try:
            moment = datetime.fromisoformat(self.expires_text)
        except ValueError:
            raise ValueError(f"expires: {self.expires_text!r} is not a date and time") from None
        return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _literal(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text.strip('"')


def _clients(form: TrustForm) -> list[Client]:
    """The clients the form names: one by name, or all the selector selects."""
    if not form.client and not form.selector.strip():
        raise ValueError("choose the clients: a name, or a selector")
    ids = receivers_chosen(
        client_name=form.client, selector_text=form.selector, receivers_only=False
    )
    return list(Client.objects.filter(id__in=ids).order_by("name"))


def _plan(form: TrustForm, *, apply: bool, actor=None):
    authority = Authority.objects.filter(name=form.authority).first()
    if authority is None:
        raise ValueError("choose the authority that attests")
    arguments = {"authority": authority, "clients": _clients(form)}
    if apply:
        arguments["actor"] = actor
    if form.operation == trust.ATTEST:
        arguments.update(values=form.values(), expires_at=form.expires_at())
        run = trust.attest_for_clients if apply else trust.plan_attestation
    elif form.operation == trust.RENEW:
        arguments.update(names=form.names() or None, expires_at=form.expires_at())
        run = trust.renew_for_clients if apply else trust.plan_renewal
    else:
        arguments.update(names=form.names())
        run = trust.revoke_for_clients if apply else trust.plan_revocation
    return run(**arguments)


@require_POST
@requires(READ, action="trust.preview")
def preview(request: HttpRequest) -> HttpResponse:
    """What the operation would do, client by client, before anything changes."""
    return _answer(request, apply=False)


@require_POST
@requires(ATTEST, action="trust.apply")
@requires_fresh_code
def apply(request: HttpRequest) -> HttpResponse:
    """Carry the operation out for the clients its plan accepts (audited)."""
    return _answer(request, apply=True)


def _answer(request: HttpRequest, *, apply: bool) -> HttpResponse:
    form = TrustForm.from_post(request.POST)
    if form.operation not in OPERATIONS:
        form.operation = trust.ATTEST
    try:
        plan = _plan(form, apply=apply, actor=actor_of(request))
    except (ValueError, LookupError, PolicySyntaxError, BrokerError) as error:
        message = error.message if isinstance(error, BrokerError) else str(error)
        return render(request, f"{TEMPLATE}#plan", {"problem": message}, status=400)
    context = {"plan": plan, "applied": apply, "form": form, "shown": SHOWN_CHANGES}
    return render(request, f"{TEMPLATE}#plan", context)


@require_POST
@requires(MANAGE_AUTHORITIES, action="authority.manage")
@requires_fresh_code
def manage_authority(request: HttpRequest, name: str) -> HttpResponse:
    """Rotate an authority's key (shown once), or disable / enable it."""
    authority = get_object_or_404(Authority, name=name)
    actor = actor_of(request)
    context: dict = {"authority": authority}
    do = request.POST.get("do")
    if do == "rotate":
        context["new_key"] = authority_services.rotate_authority_key(
            authority=authority, actor=actor
        )
    elif do in ("disable", "enable"):
        authority_services.set_authority_active(
            authority=authority, active=do == "enable", actor=actor
        )
        authority.refresh_from_db()
    else:
        return HttpResponse("Say what to do: rotate, disable or enable.", status=400)
    return render(request, f"{TEMPLATE}#authority-notice", context)
