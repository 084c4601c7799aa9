"""Authorities (third-party qualifiers), the grants clients give them, and the
attestations they make."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from broker import audit
from broker.attribute_store import printable, write_values
from broker.attributes import check_values
from broker.audit import Actor
from broker.credentials import key_digest, new_secret
from broker.dispatch import entry
from broker.errors import AuthenticationFailed, InvalidInput, NotAuthorised
from broker.models import AttestationGrant, AttributeValue, Authority, Client, ModelAttribute
from broker.selectors import declared_types


def create_authority(
    *,
    name: str,
    display_name: str,
    capabilities: Iterable[ModelAttribute],
    actor: Actor,
) -> tuple[Authority, str]:
    """Create an authority that may set the given attributes; return it and its key."""
    key = new_secret("sna")
    try:
        with transaction.atomic():
            authority = Authority.objects.create(
                name=name, display_name=display_name, key_hash=key_digest(key)
            )
            authority.capabilities.set(list(capabilities))
            audit.record_change(
                actor=actor,
                action="authority.create",
                target=f"authority:{name}",
                details={"capabilities": [str(c) for c in authority.capabilities.all()]},
            )
    except IntegrityError:
        raise InvalidInput(f"an authority named {name!r} already exists", field="name") from None
    return authority, key


def authenticate_authority(key: str) -> Authority:
    """The active authority holding `key`, else AuthenticationFailed."""
    authority = Authority.objects.filter(key_hash=key_digest(key), is_active=True).first()
    if authority is None:
        raise AuthenticationFailed("the authority key is unknown or disabled")
    return authority


def grant_authority(*, client: Client, authority: Authority, actor: Actor) -> str:
    """The client lets `authority` attest its attributes; return the grant key, once."""
    key = new_secret("sng")
    with transaction.atomic():
        AttestationGrant.objects.create(
            client=client, authority=authority, key_hash=key_digest(key)
        )
        audit.record_change(
            actor=actor,
            action="grant.create",
            target=f"client:{client.name}",
            details={"authority": authority.name},
        )
    return key


def revoke_grants(*, client: Client, authority: Authority, actor: Actor) -> int:
    """Withdraw the client's permission; the authority's attestations are revoked too."""
    now = timezone.now()
    with transaction.atomic():
        count = AttestationGrant.objects.filter(
            client=client, authority=authority, revoked_at__isnull=True
        ).update(revoked_at=now)
        client.attribute_values.filter(authority=authority, revoked_at__isnull=True).update(
            revoked_at=now
        )
        audit.record_change(
            actor=actor,
            action="grant.revoke",
            target=f"client:{client.name}",
            details={"authority": authority.name, "grants": count},
        )
        entry.client_changed(client)
    return count


def attest_attributes(
    *,
    authority: Authority,
    client: Client,
    grant_key: str,
    values: Mapping[str, Any],
    expires_at: datetime | None = None,
) -> None:
    """Set attributes on `client` as `authority`: all of them, or none.

    Needs a live grant from the client, and the authority's capability for each
    attribute; anything else is refused and audited.
    """
    actor = Actor("authority", authority.name)
    with audit.refusals_recorded(
        actor=actor,
        action="attributes.attest",
        target=f"client:{client.name}",
        details={"attempted": printable(values)},
    ):
        _check_grant(authority, client, grant_key)
        checked = check_values(declared_types(client), values)
        _check_capabilities(authority, client, checked)
        _check_expiry(expires_at)
    with transaction.atomic():
        write_values(
            client,
            checked,
            source=AttributeValue.Source.AUTHORITY,
            authority=authority,
            expires_at=expires_at,
        )
        audit.record_change(
            actor=actor,
            action="attributes.attest",
            target=f"client:{client.name}",
            details={"values": checked, "expires_at": expires_at and expires_at.isoformat()},
        )
        entry.client_changed(client)


def _check_grant(authority: Authority, client: Client, grant_key: str) -> None:
    granted = AttestationGrant.objects.filter(
        client=client, authority=authority, key_hash=key_digest(grant_key), revoked_at__isnull=True
    ).exists()
    if not granted:
        raise NotAuthorised(
            f"{client.name} has not granted {authority.name} permission (or revoked it)",
            field="grant_key",
        )


def _check_capabilities(authority: Authority, client: Client, values: Mapping[str, Any]) -> None:
    allowed = set(authority.capabilities.filter(model=client.model).values_list("name", flat=True))
    refused = sorted(set(values) - allowed)
    if refused:
        raise NotAuthorised(
            f"{authority.name} may not set {', '.join(refused)} on {client.model.name} clients",
            field=refused[0],
        )


def _check_expiry(expires_at: datetime | None) -> None:
    if expires_at is not None and expires_at <= timezone.now():
        raise InvalidInput("the attestation would already have expired", field="expires_at")


def revoke_attestation(*, authority: Authority, client: Client, names: Iterable[str]) -> int:
    """Revoke values this authority attested on `client`; return how many."""
    names = list(names)
    with transaction.atomic():
        count = client.attribute_values.filter(
            authority=authority, name__in=names, revoked_at__isnull=True
        ).update(revoked_at=timezone.now())
        audit.record_change(
            actor=Actor("authority", authority.name),
            action="attributes.revoke",
            target=f"client:{client.name}",
            details={"names": names, "revoked": count},
        )
        entry.client_changed(client)
    return count
