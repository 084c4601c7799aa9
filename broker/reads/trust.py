"""Reads of trust: authorities, the grants clients gave them and what they attested."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from django.db.models import Count, Exists, OuterRef, Q, QuerySet

from broker.models import (
    AttestationGrant,
    AttributeValue,
    Authority,
    Client,
)
from broker.reads.clients import values_by_client


def authorities_overview() -> QuerySet[Authority]:
    """Every authority with `live_grants` (how many clients' grants stand) and its
    capabilities (with their models) fetched: the trust page's list, in three queries."""
    live = Count("grants", filter=Q(grants__revoked_at__isnull=True))
    return (
        Authority.objects.annotate(live_grants=live)
        .prefetch_related("capabilities__model")
        .order_by("name")
    )


def clients_granting(authority: Authority) -> QuerySet[Client]:
    """The clients whose grant to `authority` stands: their consent to its attestations."""
    granted = AttestationGrant.objects.filter(
        client_id=OuterRef("pk"), authority=authority, revoked_at__isnull=True
    )
    return Client.objects.filter(Exists(granted))


def granted_client_ids(
    authority: Authority, client_ids: Iterable[int], *, lock: bool = False
) -> set[int]:
    """Which of `client_ids` have a grant to `authority` that stands. With `lock`, the
    grants stay as read until commit (revoking one waits), for writes that rely on them."""
    grants = AttestationGrant.objects.filter(
        authority=authority, revoked_at__isnull=True, client_id__in=list(client_ids)
    )
    if lock:
        grants = grants.select_for_update(no_key=True)
    return set(grants.values_list("client_id", flat=True))


def capabilities_by_model(authority: Authority) -> dict[int, set[str]]:
    """{model id: names of that model's attributes `authority` may attest}."""
    found = defaultdict(set)
    for model_id, name in authority.capabilities.values_list("model_id", "name"):
        found[model_id].add(name)
    return found


def values_attested_by(
    authority: Authority, client_ids: Iterable[int], names: Iterable[str] | None = None
) -> dict[int, dict]:
    """{client id: {name: (value, expires_at)}} of the values `authority` attested on
    the clients and has not revoked (expired ones included: they can be renewed), of
    `names` only if given."""
    rows = AttributeValue.objects.filter(
        authority=authority, revoked_at__isnull=True, client_id__in=list(client_ids)
    )
    if names is not None:
        rows = rows.filter(name__in=list(names))
    return values_by_client(rows)
