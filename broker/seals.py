"""Seals: the signatures an event carries to the agents (docs/security.md, "Signed
events"). What is signed is defined once, in `sn_agent.signatures`; this module signs
with the keys the console holds, checks the signatures senders bring, and hands each
notification its event's seal.

Private keys live in SIGNING_KEYS_DIR on the web hosts, never in the database:
`senders/NAME.pem` for the senders operators send for from the console, and
`authorities/NAME.pem` for the authorities whose officers attest from the Trust page.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import OrderedDict
from collections.abc import Iterable
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.conf import settings
from django.db import connection
from sn_agent import signatures

from broker.errors import BrokerError, InvalidInput
from broker.models import AttributeValue, Authority, Client, Event

SENDERS = "senders"
AUTHORITIES = "authorities"


class SigningKeyUnusable(BrokerError):
    """A key file the console holds cannot sign: the operator must fix it on the host."""

    code = "signing_key_unusable"


# Keys -----------------------------------------------------------------------------------


def key_path(kind: str, name: str) -> Path | None:
    """Where the private key of sender or authority `name` lives, if keys are kept."""
    if not settings.SIGNING_KEYS_DIR:
        return None
    return Path(settings.SIGNING_KEYS_DIR) / kind / f"{name}.pem"


def private_key(kind: str, name: str) -> Ed25519PrivateKey | None:
    """The private key the console holds for `name`, or None if it holds none."""
    path = key_path(kind, name)
    try:
        changed = path.stat().st_mtime_ns if path else None
    except FileNotFoundError:
        return None
    except OSError as error:
        raise SigningKeyUnusable(f"cannot read the key of {name}: {error.strerror}") from None
    return None if changed is None else _loaded(str(path), changed)


@lru_cache(maxsize=1024)
def _loaded(path: str, changed: int) -> Ed25519PrivateKey:
    # Keyed by the file's change time: a key replaced on disk is read again.
    try:
        return signatures.private_key_from_pem(Path(path).read_bytes())
    except (OSError, ValueError, TypeError) as error:
        raise SigningKeyUnusable(f"{path} is not a usable Ed25519 key: {error}") from None


# Events ---------------------------------------------------------------------------------


def _sender_key(sender: Client) -> Ed25519PrivateKey | None:
    """The key the console holds for `sender`, None if none; SigningKeyUnusable if it
    is not the sender's registered key."""
    key = private_key(SENDERS, sender.name)
    if key is not None and signatures.public_key_text(key.public_key()) != sender.signing_key:
        raise SigningKeyUnusable(
            f"the key the console holds for {sender.name} is not the one its receivers "
            "know (its public key in the console): make them one again "
            f"(manage.py signing_key sender {sender.name})"
        )
    return key


def console_seal(*, event_id: str, sender: Client, request, now: datetime) -> dict | None:
    """The seal of an event the console publishes for `sender` (an operator's send),
    signed with the sender's key if the console holds it; None if it holds none."""
    key = _sender_key(sender)
    if key is None:
        return None
    signed_at = int(now.timestamp())
    envelope = _envelope(event_id, sender, request, signed_at)
    return _seal(sender, request, signed_at, signatures.sign(key, envelope))


def console_signs_as(sender: Client) -> str:
    """Whether an operator's send as `sender` would be signed: "signed", "no key" (it
    goes unsigned) or "wrong key" (it is refused until the key is made again)."""
    try:
        key = _sender_key(sender)
    except SigningKeyUnusable:
        return "wrong key"
    return "no key" if key is None else "signed"


def sender_seal(*, event_id: str, sender: Client, request, signed_at: Any, signature: Any):
    """The seal of an event its sender signed (an agent's or the API's publish);
    InvalidInput if the signature does not hold for the sender's key."""
    if not sender.signing_key:
        raise InvalidInput(
            f"{sender.name} has no public key in the console to check its signature by",
            field="signature",
        )
    _check_signed_at(signed_at)
    envelope = _envelope(event_id, sender, request, signed_at)
    if not signatures.signature_holds(sender.signing_key, envelope, signature):
        raise InvalidInput(
            f"the signature does not hold for this event and {sender.name}'s key",
            field="signature",
        )
    return _seal(sender, request, signed_at, signature)


def _check_signed_at(signed_at: Any) -> None:
    if not signatures.whole_number(signed_at):
        raise InvalidInput("signed_at is the signing time in whole Unix seconds", field="signed_at")


def _envelope(event_id: str, sender: Client, request, signed_at: int) -> dict:
    return signatures.event_envelope(
        event_id=event_id,
        sender=sender.name,
        key=sender.signing_key,
        content=request.content,
        selector=request.selector,
        channel=request.channel,
        lifetime_s=request.lifetime_s,
        signed_at=signed_at,
    )


def _seal(sender: Client, request, signed_at: int, signature: str) -> dict:
    # The attestations are added as the event is stored, from the same reading of the
    # sender's attributes as its `sender_attributes` (broker.services.events.PUBLISH).
    return {
        "sender": sender.name,
        "key": sender.signing_key,
        "selector": request.selector,
        "lifetime_s": request.lifetime_s,
        "signed_at": signed_at,
        "signature": signature,
    }


# Attestations -----------------------------------------------------------------------------

# One statement for any number of values (a trust officer's 10,000 clients).
STORE_SEALS = f"""
UPDATE {AttributeValue._meta.db_table} AS value SET seal = given.seal
FROM jsonb_to_recordset(%(given)s::jsonb) AS given(id bigint, seal jsonb)
WHERE value.id = given.id
"""


def seal_attestations(*, authority: Authority, client_ids: Iterable[int]) -> int:
    """Sign again what `authority` attests of these clients, each for the client's
    current key, if the console holds the authority's key; how many values are signed.
    Without the key nothing is read or written: whoever changes a value, an expiry or
    a key clears the seals it makes wrong (the upsert, a renewal, a new key)."""
    key = private_key(AUTHORITIES, authority.name)
    if key is None:
        return 0
    if authority.signing_key not in ("", signatures.public_key_text(key.public_key())):
        raise SigningKeyUnusable(
            f"the key the console holds for {authority.name} is not its public key in the "
            f"console: make it again (manage.py signing_key authority {authority.name})"
        )
    rows = AttributeValue.objects.filter(
        client_id__in=list(client_ids), authority=authority, source=AttributeValue.Source.AUTHORITY
    ).values_list("pk", "name", "value", "expires_at", "client__name", "client__signing_key")
    given = [{"id": pk, "seal": _attestation(authority, key, *row)} for pk, *row in rows]
    if given:
        with connection.cursor() as cursor:
            cursor.execute(STORE_SEALS, {"given": json.dumps(given)})
    return sum(1 for entry in given if entry["seal"] is not None)


def _attestation(authority, key, name, value, expires_at, client, client_key) -> dict | None:
    if not client_key:
        return None  # nothing to bind the attestation to
    attestation = _attested(authority, client, client_key, name, value, expires_at, time.time())
    body = signatures.attestation_body(attestation)
    return {**attestation, "signature": signatures.sign(key, body)}


def _attested(authority, client: str, client_key: str, name, value, expires_at, signed_at):
    """An attestation's fields (sn_agent.signatures.ATTESTATION_FIELDS but the signature),
    times in whole Unix seconds."""
    return {
        "authority": authority.name,
        "client": client,
        "client_key": client_key,
        "name": name,
        "value": value,
        "expires_at": None if expires_at is None else int(expires_at.timestamp()),
        "signed_at": int(signed_at),
    }


def authority_seals(
    *, authority: Authority, client: Client, values: dict, expires_at, signed: Any
) -> dict[str, dict]:
    """The attestations an authority's own tooling signed, checked against its public
    key for this client's key ({name: seal}); InvalidInput naming what does not hold.
    `signed` is {"signed_at": whole seconds, "signatures": {name: signature}}."""
    if not authority.signing_key:
        raise InvalidInput(
            f"{authority.name} has no public key in the console to check its signatures by",
            field="signatures",
        )
    signed_at, given = _signatures_given(signed, values)
    seals = {}
    for name, value in values.items():
        attestation = _attested(
            authority, client.name, client.signing_key, name, value, expires_at, signed_at
        )
        body = signatures.attestation_body(attestation)
        if not signatures.signature_holds(authority.signing_key, body, given[name]):
            raise InvalidInput(
                f"the signature of {name} does not hold for {client.name}'s key "
                f"({client.signing_key or 'none'}) and {authority.name}'s key",
                field=f"signatures.{name}",
            )
        seals[name] = {**attestation, "signature": given[name]}
    return seals


def _signatures_given(signed: Any, values: dict) -> tuple[int, dict]:
    signed_at, given = signed.get("signed_at"), signed.get("signatures")
    _check_signed_at(signed_at)
    if not isinstance(given, dict):
        raise InvalidInput("signatures is an object: a signature per value", field="signatures")
    missing = sorted(set(values) - set(given))
    if missing:
        raise InvalidInput(f"{missing[0]} is not signed", field=f"signatures.{missing[0]}")
    return signed_at, given


STORE_GIVEN_SEALS = f"""
UPDATE {AttributeValue._meta.db_table} AS value SET seal = given.value
FROM jsonb_each(%(seals)s::jsonb) AS given
WHERE value.client_id = %(client)s AND value.name = given.key
"""


def store_seals(*, client_id: int, seals: dict[str, dict]) -> None:
    """Keep the seals an authority's tooling gave with the values just written."""
    with connection.cursor() as cursor:
        cursor.execute(STORE_GIVEN_SEALS, {"client": client_id, "seals": json.dumps(seals)})


# Notifications ----------------------------------------------------------------------------


class SealCache:
    """Each event's seal, read once per process for the live pushes of its
    deliveries (a broadcast reaches a thousand sockets of one process at once)."""

    def __init__(self, size: int = 4096) -> None:
        self.size = size
        self._seals: OrderedDict[str, Any] = OrderedDict()
        self._reading: dict[str, asyncio.Future] = {}

    async def seal_of(self, event_id: str, read) -> dict | None:
        """The seal of `event_id`; `read` is the database read run in a thread."""
        if event_id in self._seals:
            self._seals.move_to_end(event_id)
            return self._seals[event_id]
        if event_id not in self._reading:
            self._reading[event_id] = asyncio.ensure_future(read(event_id))
        future = self._reading[event_id]
        try:
            seal = await asyncio.shield(future)
        finally:
            if future.done():
                self._reading.pop(event_id, None)
        self._remember(event_id, seal)
        return seal

    def _remember(self, event_id: str, seal: Any) -> None:
        self._seals[event_id] = seal
        while len(self._seals) > self.size:
            self._seals.popitem(last=False)


def stored_seal(event_id: str) -> dict | None:
    """The seal stored with an event (None: not signed, or no such event)."""
    found = Event.objects.filter(pk=event_id).values_list("seal", flat=True)
    return next(iter(found), None)
