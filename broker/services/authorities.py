"""Authorities (third-party qualifiers), the grants clients give them, and the
attestations they make."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from django.core.cache import cache
from django.db import IntegrityError, transaction
from django.utils import timezone

from broker import audit, seals
from broker.attribute_store import printable, write_values
from broker.attributes import check_values
from broker.audit import Actor
from broker.credentials import key_digest, new_secret
from broker.dispatch import entry
from broker.errors import AuthenticationFailed, InvalidInput, NotAuthorised
from broker.models import AttestationGrant, AttributeValue, Authority, Client, ModelAttribute
from broker.reads.clients import declared_types


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


def rotate_authority_key(*, authority: Authority, actor: Actor) -> str:
    """Give `authority` a new key and return it, once; the old key stops working at
    once (only the new key's digest is stored)."""
    key = new_secret("sna")
    with transaction.atomic():
        Authority.objects.filter(pk=authority.pk).update(key_hash=key_digest(key))
        audit.record_change(
            actor=actor, action="authority.rotate_key", target=f"authority:{authority.name}"
        )
    authority.key_hash = key_digest(key)
    return key


def set_authority_active(*, authority: Authority, active: bool, actor: Actor) -> None:
    """Enable or disable `authority`: a disabled one cannot log in with its key, and
    officers cannot attest or renew on its behalf (its values stand until revoked)."""
    with transaction.atomic():
        before = Authority.objects.select_for_update().get(pk=authority.pk).is_active
        Authority.objects.filter(pk=authority.pk).update(is_active=active)
        audit.record_change(
            actor=actor,
            action="authority.set_active",
            target=f"authority:{authority.name}",
            details={"before": before, "after": active},
        )
    authority.is_active = active


def set_capabilities(
    *, authority: Authority, capabilities: Iterable[ModelAttribute], actor: Actor
) -> None:
    """Replace the attributes `authority` may attest. Values it attested under a
    capability it loses stand until revoked; it can set no new ones."""
    capabilities = list(capabilities)
    with transaction.atomic():
        # The bulk attestations lock this row too: none of them runs on the old set.
        Authority.objects.select_for_update().filter(pk=authority.pk).first()
        before = _capability_names(authority)
        authority.capabilities.set(capabilities)
        audit.record_change(
            actor=actor,
            action="authority.set_capabilities",
            target=f"authority:{authority.name}",
            details={"before": before, "after": _capability_names(authority)},
        )


def _capability_names(authority: Authority) -> list[str]:
    rows = authority.capabilities.values_list("model__name", "name")
    return sorted(f"{model}.{name}" for model, name in rows)


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
            revoked_at=now, revoked_by=str(actor)
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
    signed: Mapping[str, Any] | None = None,
) -> None:
    """Set attributes on `client` as `authority`: all of them, or none.

    Needs a live grant from the client, and the authority's capability for each
    attribute; anything else is refused and audited. `signed` ({"signed_at": ...,
    "signatures": {name: ...}}) is the authority's own signature of each value, checked
    and kept (broker.seals); without it the console signs if it holds the key.
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
        check_expiry(expires_at)
        given = None
        if signed is not None:
            given = seals.authority_seals(
                authority=authority, client=client, values=checked, expires_at=expires_at,
                signed=signed,
            )  # fmt: skip
    with transaction.atomic():
        write_values(
            client,
            checked,
            source=AttributeValue.Source.AUTHORITY,
            authority=authority,
            expires_at=expires_at,
            seals=given,
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


def check_expiry(expires_at: datetime | None) -> None:
    """Refuse an expiry that has already passed."""
    if expires_at is not None and expires_at <= timezone.now():
        raise InvalidInput("the attestation would already have expired", field="expires_at")


def revoke_attestation(*, authority: Authority, client: Client, names: Iterable[str]) -> int:
    """Revoke values this authority attested on `client`; return how many."""
    names = list(names)
    with transaction.atomic():
        count = client.attribute_values.filter(
            authority=authority, name__in=names, revoked_at__isnull=True
        ).update(revoked_at=timezone.now(), revoked_by=str(Actor("authority", authority.name)))
        audit.record_change(
            actor=Actor("authority", authority.name),
            action="attributes.revoke",
            target=f"client:{client.name}",
            details={"names": names, "revoked": count},
        )
        entry.client_changed(client)
    return count


# Expiry: an attested value stops being live at its `expires_at` without any write, so
# nothing would tell the leaves, whose matchers keep what they last loaded.
EXPIRY_CHECKED_THROUGH = "broker:attestations-expired-through"  # cache key
# Each run looks again this far before the last one's end: a run that overlapped a
# slow one, or a worker whose clock is a little behind, gets a second notice.
EXPIRY_OVERLAP = timedelta(seconds=10)
# Without a record of the last run (the first one, or Redis lost it), look this far back.
EXPIRY_FIRST_LOOK_BACK = timedelta(days=1)


def announce_expired_attestations(*, after: datetime, through: datetime) -> int:
    """Log a change for every client with a value that expired in (after, through]
    and was not revoked (revoking logged one already), so that its leaf reloads it;
    return how many. Not audited: nothing changes but the time, and the expiry was
    audited with the attestation."""
    expired = AttributeValue.objects.filter(
        expires_at__gt=after, expires_at__lte=through, revoked_at__isnull=True
    )
    clients = Client.objects.filter(pk__in=expired.values("client_id"), dispatcher__isnull=False)
    with transaction.atomic():
        only_ids = clients.only("pk", "dispatcher_id")
        return entry.clients_changed(only_ids)


def announce_expirations_since_last_run() -> int:
    """`announce_expired_attestations` from the last run's end (less the overlap) to
    now; run again, it only repeats the overlap."""
    now = timezone.now()
    last = cache.get(EXPIRY_CHECKED_THROUGH) or now - EXPIRY_FIRST_LOOK_BACK
    count = announce_expired_attestations(after=last - EXPIRY_OVERLAP, through=now)
    cache.set(EXPIRY_CHECKED_THROUGH, now, timeout=None)
    return count
