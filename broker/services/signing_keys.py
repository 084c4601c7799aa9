"""Signing keys: a sender's public key, which authorities' attestations bind, and the
private keys the console keeps for the senders and authorities it signs for
(docs/security.md, "Signed events"). Every change is audited.

A private key file is never lost: one replaced by a new key (a rotation) or given up
(an authority that now signs with its own tooling) is kept aside beside it, as
NAME.pem.replaced-TIME, which the console never reads; delete it once no agent
trusts that key any more."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

from django.db import transaction
from sn_agent import signatures

from broker import audit, seals
from broker.audit import Actor
from broker.errors import InvalidInput
from broker.models import AttributeValue, Authority, Client


def set_signing_key(*, client: Client, public_key: str, actor: Actor) -> int:
    """Make `public_key` the key `client` signs its events with (a sender that keeps
    its own key sends the public half). Every attestation of the client is signed again
    for it by the authorities whose keys the console holds; the others no longer hold
    until their authority signs them again. How many attestations were signed."""
    target = f"client:{client.name}"
    _check_public_key(public_key, actor=actor, action="client.signing_key", target=target)
    with transaction.atomic():
        client.signing_key = public_key
        client.save(update_fields=["signing_key"])
        # Every attestation bound the old key: only those signed again hold.
        AttributeValue.objects.filter(client=client).update(seal=None)
        signed = _seal_all_attestations_of(client)
        audit.record_change(
            actor=actor,
            action="client.signing_key",
            target=target,
            details={"public_key": public_key, "attestations_signed": signed},
        )
    return signed


def make_sender_key(*, client: Client, actor: Actor) -> str:
    """A new key pair for a sender the console sends for: the private key goes to
    SIGNING_KEYS_DIR, the public key to the client. Its public key."""
    key = signatures.new_private_key()
    public_key = signatures.public_key_text(key.public_key())
    with transaction.atomic():
        set_signing_key(client=client, public_key=public_key, actor=actor)
        write_private_key(seals.SENDERS, client.name, key)
    return public_key


def make_authority_key(*, authority: Authority, actor: Actor) -> str:
    """A new key for an authority whose officers attest from the console: kept in
    SIGNING_KEYS_DIR; every attestation of the authority is signed again with it.
    Its public key, for the agents' [trust] (add it beside the old one, then remove
    the old one once every agent has the new: a rotation without downtime)."""
    key = signatures.new_private_key()
    public_key = signatures.public_key_text(key.public_key())
    with transaction.atomic():
        write_private_key(seals.AUTHORITIES, authority.name, key)
        _record_authority_key(authority, public_key, actor)
    return public_key


def set_authority_key(*, authority: Authority, public_key: str, actor: Actor) -> None:
    """Record the public key of an authority that signs its attestations with its own
    tooling (the console never holds its private key). Audited."""
    target = f"authority:{authority.name}"
    _check_public_key(public_key, actor=actor, action="authority.signing_key", target=target)
    with transaction.atomic():
        _remove_key(seals.AUTHORITIES, authority.name)  # the console signs for it no more
        _record_authority_key(authority, public_key, actor)


def _check_public_key(public_key: str, *, actor: Actor, action: str, target: str) -> None:
    """A public key given to the console is an Ed25519 key; a refusal is audited."""
    with audit.refusals_recorded(actor=actor, action=action, target=target):
        try:
            signatures.public_key(public_key)
        except ValueError as error:
            raise InvalidInput(str(error), field="public_key") from None


def _remove_key(kind: str, name: str) -> None:
    path = seals.key_path(kind, name)
    if path is not None and _keep_aside(path):
        path.unlink()


def _record_authority_key(authority: Authority, public_key: str, actor: Actor) -> None:
    # Its attestations were signed with another key: only those signed again hold.
    authority.signing_key = public_key
    authority.save(update_fields=["signing_key"])
    AttributeValue.objects.filter(authority=authority).update(seal=None)
    attested = AttributeValue.objects.filter(authority=authority).values_list("client_id")
    signed = seals.seal_attestations(authority=authority, client_ids=attested)
    audit.record_change(
        actor=actor,
        action="authority.signing_key",
        target=f"authority:{authority.name}",
        details={"public_key": public_key, "attestations_signed": signed},
    )


def _seal_all_attestations_of(client: Client) -> int:
    authority_ids = AttributeValue.objects.filter(client=client, authority__isnull=False)
    authorities = Authority.objects.filter(pk__in=authority_ids.values("authority_id"))
    return sum(
        seals.seal_attestations(authority=authority, client_ids=[client.pk])
        for authority in authorities
    )


def write_private_key(kind: str, name: str, key) -> None:
    """Write the private key readable by its owner only (SIGNING_KEYS_DIR/KIND/NAME.pem),
    in place of any old one at once (the console never signs with neither), the old one
    kept aside."""
    path = seals.key_path(kind, name)
    if path is None:
        raise InvalidInput("set SIGNING_KEYS_DIR to keep signing keys", field="SIGNING_KEYS_DIR")
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    partial = Path(f"{path}.new")
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "wb") as file:
        file.write(signatures.private_key_pem(key))
        file.flush()
        os.fsync(file.fileno())
    _keep_aside(path)
    os.replace(partial, path)


def _keep_aside(path: Path) -> Path | None:
    """Link the key file at `path` (if there is one) to a name of its own beside it,
    NAME.pem.replaced-TIME, which nothing reads; that name, or None. A link: the key
    stays at `path` too, for the moment it is replaced in one step."""
    aside = path.with_name(f"{path.name}.replaced-{datetime.now(UTC):%Y%m%dT%H%M%S.%fZ}")
    try:
        os.link(path, aside)
    except FileNotFoundError:
        return None
    return aside
