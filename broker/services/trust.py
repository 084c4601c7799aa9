"""A trust officer's attestations on behalf of an authority, for many clients at once.

Each operation is a plan (a preview: per client, what changes, or why it is refused)
and its application: the plan made again inside one transaction, applied to the clients
that can take it, audited as one change, with the refusals audited once. A plan reads
a constant number of queries whatever the number of clients.

The officer does not hold the clients' grant keys: a client's consent is its grant to
the authority, as long as it stands. The authority's capabilities and the clients'
models bound what can be set, exactly as for the authority itself.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from broker import audit
from broker.attribute_store import printable, write_values_of_clients
from broker.attributes import check_values
from broker.audit import Actor
from broker.dispatch import entry
from broker.errors import InvalidInput, NotAuthorised
from broker.inputs import check_decoded, check_text
from broker.models import AttributeValue, Authority, Client
from broker.reads.clients import declared_types_by_model, live_values_of, model_names
from broker.reads.trust import capabilities_by_model, granted_client_ids, values_attested_by
from broker.seals import seal_attestations
from broker.services.authorities import check_expiry

ATTEST, RENEW, REVOKE = "attest", "renew", "revoke"
Clients = Iterable[Client] | QuerySet[Client]


class Target(NamedTuple):
    """What a plan needs of a client (read without building model instances)."""

    pk: int
    name: str
    model_id: int
    dispatcher_id: int | None


@dataclass(frozen=True)
class ValueChange:
    """One attribute of one client, before and after. `before` is None when the client
    has no live value; `after` is None when the value is revoked."""

    name: str
    before: Any
    after: Any
    expires_before: datetime | None
    expires_after: datetime | None


@dataclass(frozen=True)
class ClientPlan:
    """What an operation does to one client: its changes, or why it is refused."""

    client_id: int
    client: str
    changes: tuple[ValueChange, ...] = ()
    refusal: str | None = None

    @property
    def accepted(self) -> bool:
        """Whether the operation applies to this client."""
        return self.refusal is None


@dataclass(frozen=True)
class AttestationPlan:
    """The effect of attesting, renewing or revoking for many clients, by name."""

    action: str
    authority: str
    expires_at: datetime | None
    clients: tuple[ClientPlan, ...]

    @property
    def accepted(self) -> list[ClientPlan]:
        """The clients the operation applies to."""
        return [plan for plan in self.clients if plan.accepted]

    @property
    def refused(self) -> list[ClientPlan]:
        """The clients it leaves alone, each with its reason."""
        return [plan for plan in self.clients if not plan.accepted]

    @property
    def counts(self) -> dict[str, int]:
        """How many clients in all, accepted and refused."""
        accepted = len(self.accepted)
        return {"clients": len(self.clients), "accepted": accepted,
                "refused": len(self.clients) - accepted}  # fmt: skip

    def refusals_by_reason(self) -> dict[str, list[str]]:
        """{reason: names of the clients refused for it}."""
        found = defaultdict(list)
        for plan in self.refused:
            found[plan.refusal].append(plan.client)
        return dict(found)


# ---------------------------------------------------------------------------
# Attesting


def plan_attestation(
    *,
    authority: Authority,
    clients: Clients,
    values: Mapping[str, Any],
    expires_at: datetime | None,
) -> AttestationPlan:
    """Preview setting `values` as `authority` on each client: set where the client's
    grant stands, the authority may set every value on the client's model and each
    value fits its type; refused otherwise, saying why."""
    _check_values_given(values)
    check_expiry(expires_at)
    _check_active(authority)
    return _attestation_plan(authority, _distinct(clients), values, expires_at)


def attest_for_clients(
    *,
    authority: Authority,
    clients: Clients,
    values: Mapping[str, Any],
    expires_at: datetime | None,
    actor: Actor,
) -> AttestationPlan:
    """Set `values` as `authority` on the clients its plan accepts, in one transaction;
    return the plan applied. The other clients are left alone and audited as refused."""
    clients = _distinct(clients)
    with transaction.atomic():
        with _refusals(actor, ATTEST, authority, {"attempted": printable(values)}):
            _check_values_given(values)
            check_expiry(expires_at)
            _check_active(_locked(authority))
        plan = _attestation_plan(authority, clients, values, expires_at, lock=True)
        for values_set, client_ids in _by_values_set(plan).items():
            write_values_of_clients(
                client_ids,
                json.loads(values_set),
                source=AttributeValue.Source.AUTHORITY,
                authority=authority,
                expires_at=expires_at,
            )
        _record(plan, actor, clients, values=printable(values))
    return plan


def _by_values_set(plan: AttestationPlan) -> dict[str, list[int]]:
    """{the values to set, as JSON: the accepted clients taking them}. One set for
    every client (a name has one type, so one stored form, across models), but keyed
    by its exact JSON all the same (in Python, 1 == True)."""
    found = defaultdict(list)
    for accepted in plan.accepted:
        values = json.dumps({change.name: change.after for change in accepted.changes})
        found[values].append(accepted.client_id)
    return found


def _attestation_plan(
    authority: Authority,
    clients: list[Target],
    values: Mapping[str, Any],
    expires_at: datetime | None,
    *,
    lock: bool = False,
) -> AttestationPlan:
    ids = [client.pk for client in clients]
    granted = granted_client_ids(authority, ids, lock=lock)
    fitting = _values_by_model(authority, {client.model_id for client in clients}, values)
    current = live_values_of(ids, values)
    plans = [
        _attest_one(authority, client, client.pk in granted, fitting[client.model_id],
                    current.get(client.pk, {}), expires_at)
        for client in clients
    ]  # fmt: skip
    return AttestationPlan(ATTEST, authority.name, expires_at, tuple(plans))


def _attest_one(
    authority: Authority,
    client: Target,
    granted: bool,
    fit: dict | str,
    held: dict,
    expires_at: datetime | None,
) -> ClientPlan:
    if not granted:
        return _refused(client, _no_grant(authority))
    if isinstance(fit, str):
        return _refused(client, fit)
    changes = [_change(name, held.get(name), value, expires_at) for name, value in fit.items()]
    return ClientPlan(client.pk, client.name, tuple(changes))


def _values_by_model(
    authority: Authority, model_ids: set[int], values: Mapping[str, Any]
) -> dict[int, dict | str]:
    """{model id: the values checked for its clients, or why they refuse them}."""
    declared = declared_types_by_model(model_ids)
    capable = capabilities_by_model(authority)
    names = model_names(model_ids)
    return {
        model_id: _fit(authority, names[model_id], declared[model_id], capable[model_id], values)
        for model_id in model_ids
    }


def _fit(
    authority: Authority,
    model: str,
    declared: dict[str, str],
    capable: set[str],
    values: Mapping[str, Any],
) -> dict | str:
    unknown = sorted(set(values) - set(declared))
    if unknown:
        return f"{', '.join(unknown)}: not an attribute of {model} clients"
    lacking = sorted(set(values) - capable)
    if lacking:
        return _may_not_set(authority, lacking, model)
    try:
        return check_values(declared, values)
    except InvalidInput as mismatch:
        return mismatch.message


# ---------------------------------------------------------------------------
# Renewing


def plan_renewal(
    *,
    authority: Authority,
    clients: Clients,
    names: Iterable[str] | None,
    expires_at: datetime | None,
) -> AttestationPlan:
    """Preview giving the values `authority` attested on each client (of `names`, or
    all of them) the expiry `expires_at`, keeping the values. Expired values count
    (renewing brings them back), revoked ones do not; the grant and the capability
    must still stand."""
    names = _checked_names(names, required=False)
    check_expiry(expires_at)
    _check_active(authority)
    return _renewal_plan(authority, _distinct(clients), names, expires_at)


def renew_for_clients(
    *,
    authority: Authority,
    clients: Clients,
    names: Iterable[str] | None,
    expires_at: datetime | None,
    actor: Actor,
) -> AttestationPlan:
    """Apply `plan_renewal` in one transaction; return the plan applied."""
    clients = _distinct(clients)
    names = None if names is None else list(names)
    with transaction.atomic():
        with _refusals(actor, RENEW, authority, {"names": names}):
            names = _checked_names(names, required=False)
            check_expiry(expires_at)
            _check_active(_locked(authority))
        plan = _renewal_plan(authority, clients, names, expires_at, lock=True)
        _attested_rows(authority, plan).update(expires_at=expires_at, seal=None)
        seal_attestations(authority=authority, client_ids=[c.client_id for c in plan.accepted])
        _record(plan, actor, clients, names=names)
    return plan


def _renewal_plan(
    authority: Authority,
    clients: list[Target],
    names: list[str] | None,
    expires_at: datetime | None,
    *,
    lock: bool = False,
) -> AttestationPlan:
    ids = [client.pk for client in clients]
    granted = granted_client_ids(authority, ids, lock=lock)
    capable = capabilities_by_model(authority)
    models = model_names({client.model_id for client in clients})
    attested = values_attested_by(authority, ids, names)
    plans = [
        _renew_one(authority, client, client.pk in granted, attested.get(client.pk, {}),
                   capable[client.model_id], models[client.model_id], names, expires_at)
        for client in clients
    ]  # fmt: skip
    return AttestationPlan(RENEW, authority.name, expires_at, tuple(plans))


def _renew_one(
    authority: Authority,
    client: Target,
    granted: bool,
    held: dict,
    capable: set[str],
    model: str,
    names: list[str] | None,
    expires_at: datetime | None,
) -> ClientPlan:
    lacking = sorted(set(held) - capable)
    if not granted:
        return _refused(client, _no_grant(authority))
    if lacking:
        return _refused(client, _may_not_set(authority, lacking, model))
    if not held:
        return _refused(client, _nothing_attested(authority, names, "renew"))
    changes = [_change(name, held[name], held[name][0], expires_at) for name in sorted(held)]
    return ClientPlan(client.pk, client.name, tuple(changes))


# ---------------------------------------------------------------------------
# Revoking


def plan_revocation(
    *, authority: Authority, clients: Clients, names: Iterable[str]
) -> AttestationPlan:
    """Preview revoking the values of `names` that `authority` attested on each client.
    Withdrawing needs neither the client's grant nor the capability."""
    names = _checked_names(names, required=True)
    return _revocation_plan(authority, _distinct(clients), names)


def revoke_for_clients(
    *, authority: Authority, clients: Clients, names: Iterable[str], actor: Actor
) -> AttestationPlan:
    """Apply `plan_revocation` in one transaction; return the plan applied."""
    clients = _distinct(clients)
    names = list(names)
    with transaction.atomic():
        with _refusals(actor, REVOKE, authority, {"names": names}):
            names = _checked_names(names, required=True)
        _locked(authority)
        plan = _revocation_plan(authority, clients, names)
        _attested_rows(authority, plan).update(revoked_at=timezone.now(), revoked_by=str(actor))
        _record(plan, actor, clients, names=names)
    return plan


def _revocation_plan(authority: Authority, clients: list[Target], names: list[str]):
    attested = values_attested_by(authority, [client.pk for client in clients], names)
    plans = []
    for client in clients:
        held = attested.get(client.pk, {})
        if not held:
            plans.append(_refused(client, _nothing_attested(authority, names, "revoke")))
        else:
            changes = [_change(n, held[n], None, None) for n in sorted(held)]
            plans.append(ClientPlan(client.pk, client.name, tuple(changes)))
    return AttestationPlan(REVOKE, authority.name, None, tuple(plans))


# ---------------------------------------------------------------------------
# Shared steps


def _distinct(clients: Clients) -> list[Target]:
    """The clients once each, by name (a queryset is read in one query)."""
    if isinstance(clients, QuerySet):
        rows = clients.values_list("pk", "name", "model_id", "dispatcher_id")
    else:
        rows = ((c.pk, c.name, c.model_id, c.dispatcher_id) for c in clients)
    unique = {row[0]: Target(*row) for row in rows}
    return sorted(unique.values(), key=lambda target: target.name)


def _check_values_given(values: Any) -> None:
    if not isinstance(values, Mapping) or not values:
        raise InvalidInput("give at least one attribute value", field="values")
    if not all(isinstance(name, str) for name in values):
        raise InvalidInput("attribute names are text", field="values")
    for name in values:
        check_text(name, "values")
        check_decoded(values[name], f"values.{name}")


def _check_name_texts(names: list[str]) -> None:
    for name in names:
        check_text(name, "names")


def _checked_names(names: Iterable[str] | None, *, required: bool) -> list[str] | None:
    if names is None and not required:
        return None
    names = sorted(set(names or ()))
    if not names or not all(isinstance(name, str) for name in names):
        raise InvalidInput("name at least one attribute", field="names")
    _check_name_texts(names)
    return names


def _locked(authority: Authority) -> Authority:
    """The authority's row, locked until commit: its capabilities and state cannot
    change under a plan being applied (set_capabilities takes the same lock)."""
    return Authority.objects.select_for_update().get(pk=authority.pk)


def _check_active(authority: Authority) -> None:
    if not authority.is_active:
        raise NotAuthorised(f"{authority.name} is disabled", field="authority")


def _refusals(actor: Actor, action: str, authority: Authority, details: dict):
    return audit.refusals_recorded(
        actor=actor,
        action=f"attributes.{action}",
        target=f"authority:{authority.name}",
        details={"authority": authority.name, **details},
    )


def _refused(client: Target, reason: str) -> ClientPlan:
    return ClientPlan(client.pk, client.name, refusal=reason)


def _may_not_set(authority: Authority, names: list[str], model: str) -> str:
    return f"{authority.name} may not set {', '.join(names)} on {model} clients"


def _no_grant(authority: Authority) -> str:
    return f"no standing grant to {authority.name} (never given, or revoked)"


def _nothing_attested(authority: Authority, names: list[str] | None, verb: str) -> str:
    which = ", ".join(names) if names else "any attribute"
    return f"nothing to {verb}: {authority.name} has no value of {which} standing"


def _change(name: str, held: tuple | None, after: Any, expires_at: datetime | None):
    before, expires_before = held or (None, None)
    return ValueChange(name, before, after, expires_before, expires_at)


def _attested_rows(authority: Authority, plan: AttestationPlan) -> QuerySet[AttributeValue]:
    """The rows of the values the plan renews or revokes."""
    names = {change.name for p in plan.accepted for change in p.changes}
    return AttributeValue.objects.filter(
        authority=authority,
        revoked_at__isnull=True,
        client_id__in=[p.client_id for p in plan.accepted],
        name__in=names,
    )


def _record(plan: AttestationPlan, actor: Actor, clients: list[Target], **details) -> None:
    """Audit the plan's refusals once, and its changes as one entry; log a tree change
    per changed client."""
    if plan.refused:
        _record_refusals(plan, actor)
    accepted = {p.client_id for p in plan.accepted}
    if not accepted:
        return
    audit.record_change(
        actor=actor,
        action=f"attributes.{plan.action}",
        target=f"clients:{len(accepted)}",
        details={
            "authority": plan.authority,
            **details,
            "expires_at": plan.expires_at and plan.expires_at.isoformat(),
            "count": len(accepted),
            "clients": audit.listed([p.client for p in plan.accepted]),
        },
    )
    entry.clients_changed(client for client in clients if client.pk in accepted)


def _record_refusals(plan: AttestationPlan, actor: Actor) -> None:
    by_reason = plan.refusals_by_reason()
    audit.record_refusal(
        actor=actor,
        action=f"attributes.{plan.action}",
        target=f"authority:{plan.authority}",
        reason=f"{len(plan.refused)} of {len(plan.clients)} clients refused: "
        + "; ".join(f"{reason} ({len(names)})" for reason, names in by_reason.items()),
        details={
            "authority": plan.authority,
            "refused": {reason: audit.listed(names) for reason, names in by_reason.items()},
        },
    )
