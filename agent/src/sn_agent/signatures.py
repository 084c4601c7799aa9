"""End-to-end authenticity: what senders and authorities sign, and how an agent checks
it before it acts (docs/security.md, "Signed events").

An event's sender signs its **envelope** (event id, sender name and public key,
content, selector, channel, lifetime, time of signing) with Ed25519. An authority signs
each **attestation** (the client's name and public key, one attribute's name and value,
its expiry, the time of signing). A notification carries both in its `seal`; the agent
rebuilds the signed texts from what it is given, checks every signature against keys
it was configured with, and derives the sender's attributes from the attestations that
hold, never from the console's word. So whoever writes the console's database or its
Redis, without a private key, cannot make an agent act.

The one definition of the signed texts: the console (`broker.signing`) signs with these
functions, the agent verifies with them. Python 3.9; only `cryptography`.
"""

from __future__ import annotations

import base64
import json
import uuid
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

KEY_PREFIX = "ed25519:"
# How far the clocks of the signer and the agent may disagree.
CLOCK_SKEW_S = 300
# Fields of an event's seal and of an attestation, beside what the notification holds.
SEAL_FIELDS = ("sender", "key", "selector", "lifetime_s", "signed_at", "signature", "attestations")
ATTESTATION_FIELDS = ("authority", "client", "client_key", "name", "value", "expires_at")
ATTESTATION_FIELDS += ("signed_at", "signature")


class SealRefused(Exception):
    """What a notification's seal fails on, said so that an operator can act on it."""


# Keys -----------------------------------------------------------------------------------


def public_key_text(key: Ed25519PublicKey) -> str:
    """A public key as configured and stored: `ed25519:` and its 32 bytes in base64."""
    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return KEY_PREFIX + base64.b64encode(raw).decode("ascii")


def public_key(text: str) -> Ed25519PublicKey:
    """The public key `text` names; ValueError saying what is wrong with it."""
    if not isinstance(text, str) or not text.startswith(KEY_PREFIX):
        raise ValueError(f"a public key is written {KEY_PREFIX}BASE64, not {str(text)[:40]!r}")
    try:
        raw = base64.b64decode(text[len(KEY_PREFIX) :], validate=True)
        return Ed25519PublicKey.from_public_bytes(raw)
    except ValueError:
        raise ValueError(f"{text[:60]!r} is not an Ed25519 public key (32 bytes)") from None


def new_private_key() -> Ed25519PrivateKey:
    """A fresh signing key."""
    return Ed25519PrivateKey.generate()


def private_key_pem(key: Ed25519PrivateKey) -> bytes:
    """A signing key as a PEM file holds it (PKCS #8, as `openssl genpkey` writes)."""
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def private_key_from_pem(data: bytes) -> Ed25519PrivateKey:
    """The Ed25519 signing key of a PEM file; ValueError if it holds another."""
    key = serialization.load_pem_private_key(data, password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError("the file holds a key of another kind than Ed25519")
    return key


# What is signed -------------------------------------------------------------------------


def canonical(document: Mapping[str, Any]) -> bytes:
    """The bytes that are signed: JSON with sorted keys, no spaces, UTF-8."""
    text = json.dumps(
        document, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )
    return text.encode("utf-8")


def event_envelope(
    *,
    event_id: str,
    sender: str,
    key: str,
    content: Mapping[str, Any],
    selector: str,
    channel: str,
    lifetime_s: int,
    signed_at: int,
) -> Dict[str, Any]:
    """What a sender signs of an event: everything a receiver acts on."""
    return {
        "signed": "event",
        "id": event_id,
        "sender": sender,
        "key": key,
        "content": dict(content),
        "selector": selector,
        "channel": channel,
        "lifetime_s": lifetime_s,
        "signed_at": signed_at,
    }


def attestation_body(attestation: Mapping[str, Any]) -> Dict[str, Any]:
    """What an authority signs of an attestation (its fields but the signature)."""
    body = {name: attestation.get(name) for name in ATTESTATION_FIELDS if name != "signature"}
    return {"signed": "attestation", **body}


def sign(key: Ed25519PrivateKey, document: Mapping[str, Any]) -> str:
    """The signature of `document` in base64."""
    return base64.b64encode(key.sign(canonical(document))).decode("ascii")


def signature_holds(key_text: str, document: Mapping[str, Any], signature: Any) -> bool:
    """Whether `signature` is the signature of `document` by the key `key_text`."""
    try:
        raw = base64.b64decode(signature, validate=True)
        public_key(key_text).verify(raw, canonical(document))
    except (InvalidSignature, ValueError, TypeError):
        return False
    return True


# What the agent checks --------------------------------------------------------------------


@dataclass(frozen=True)
class Verified:
    """A notification whose seal holds: who sent it and what is attested of them."""

    sender: str
    selector: str
    signed_at: int
    lifetime_s: int
    sender_attributes: Dict[str, Any]
    # Attestations that did not hold, each with why (they count for nothing).
    set_aside: Tuple[str, ...] = ()


def verify_seal(
    seal: Any,
    *,
    event_id: str,
    content: Mapping[str, Any],
    channel: str,
    authorities: Mapping[str, Sequence[str]],
    now: float,
) -> Verified:
    """Check a notification's seal; SealRefused saying why it does not hold.

    `authorities` maps each authority the agent trusts to its public keys (several
    while one rotates). The sender's attributes are those of the attestations that an
    authority of `authorities` signed for this sender and this sender's key, and that
    had not expired when the event was signed; a sender with none is refused.
    """
    seal = _seal_fields(seal)
    envelope = event_envelope(
        event_id=event_id,
        sender=seal["sender"],
        key=seal["key"],
        content=content,
        selector=seal["selector"],
        channel=channel,
        lifetime_s=seal["lifetime_s"],
        signed_at=seal["signed_at"],
    )
    if not signature_holds(seal["key"], envelope, seal["signature"]):
        raise SealRefused(f"the signature of {seal['sender']} does not hold for this event")
    _check_times(seal, now)
    attributes, set_aside = _attested(seal, authorities)
    if not attributes:
        # The signature alone proves only that someone holds the key it names; an
        # authority's attestation is what ties that key to a sender anyone trusts.
        why = f" ({set_aside[0]})" if set_aside else ""
        raise SealRefused(
            f"no authority this agent trusts attests {seal['sender']} with this key{why}"
        )
    return Verified(
        sender=seal["sender"],
        selector=seal["selector"],
        signed_at=seal["signed_at"],
        lifetime_s=seal["lifetime_s"],
        sender_attributes=attributes,
        set_aside=tuple(set_aside),
    )


def _seal_fields(seal: Any) -> Dict[str, Any]:
    if not isinstance(seal, dict):
        raise SealRefused("the event is not signed by its sender")
    missing = [name for name in SEAL_FIELDS if name not in seal]
    if missing:
        raise SealRefused(f"the event's seal lacks {', '.join(missing)}")
    kinds = {"sender": str, "key": str, "selector": str, "signature": str, "attestations": list}
    for name, kind in kinds.items():
        if not isinstance(seal[name], kind):
            raise SealRefused(f"the event's seal has a {name} of the wrong kind")
    for name in ("lifetime_s", "signed_at"):
        if not whole_number(seal[name]):
            raise SealRefused(f"the event's seal has a {name} that is not a whole number")
    return seal


def whole_number(value: Any) -> bool:
    """Whether `value` is a whole number and not true/false (times, lifetimes)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _check_times(seal: Mapping[str, Any], now: float) -> None:
    """An event signed in the future, or whose lifetime is over, is not acted on: a
    genuine event replayed after its time must not run again."""
    if seal["signed_at"] > now + CLOCK_SKEW_S:
        raise SealRefused("the event was signed in the future (check the clocks)")
    if seal["signed_at"] + seal["lifetime_s"] + CLOCK_SKEW_S < now:
        raise SealRefused("the event's lifetime was over when it arrived")


def _attested(seal: Mapping[str, Any], authorities) -> Tuple[Dict[str, Any], List[str]]:
    """{name: value} of the attestations that hold, and why the others do not."""
    attributes: Dict[str, Any] = {}
    newest: Dict[str, int] = {}
    set_aside = []
    for attestation in seal["attestations"]:
        problem = attestation_problem(attestation, seal, authorities)
        if problem is not None:
            set_aside.append(problem)
            continue
        name = attestation["name"]
        # Two authorities may attest one name: the newest attestation holds, as in the
        # console, where an attestation replaces the value before it.
        if name not in newest or attestation["signed_at"] > newest[name]:
            attributes[name], newest[name] = attestation["value"], attestation["signed_at"]
    return attributes, set_aside


def attestation_problem(
    attestation: Any, seal: Mapping[str, Any], authorities: Mapping[str, Sequence[str]]
) -> Optional[str]:
    """Why one attestation counts for nothing for this event, or None if it holds."""
    if not isinstance(attestation, dict) or not all(
        name in attestation for name in ATTESTATION_FIELDS
    ):
        return "an attestation lacks fields"
    name = f"{attestation['name']!s:.64} from {attestation['authority']!s:.64}"
    keys = (
        authorities.get(attestation["authority"])
        if isinstance(attestation["authority"], str)
        else None
    )
    if not keys:
        return f"{name}: not an authority this agent trusts"
    if attestation["client"] != seal["sender"] or attestation["client_key"] != seal["key"]:
        return f"{name}: attests another client or another key"
    body = attestation_body(attestation)
    if not any(signature_holds(key, body, attestation["signature"]) for key in keys):
        return f"{name}: the authority's signature does not hold"
    return _expiry_problem(name, attestation, seal)


def _expiry_problem(name: str, attestation: Mapping[str, Any], seal) -> Optional[str]:
    expires_at, signed_at = attestation["expires_at"], attestation["signed_at"]
    if not whole_number(signed_at) or not (expires_at is None or whole_number(expires_at)):
        return f"{name}: its times are not whole numbers"
    if expires_at is not None and expires_at <= seal["signed_at"]:
        return f"{name}: it had expired when the event was signed"
    return None


def signed_publish(
    key: Ed25519PrivateKey,
    *,
    sender: str,
    content: Mapping[str, Any],
    selector: str,
    channel: str,
    lifetime_s: int,
    now: float,
) -> Dict[str, Any]:
    """What a sender adds to a `publish` to sign it: the event's id (chosen here), the
    signing time and the signature."""
    event_id, signed_at = str(uuid.uuid4()), int(now)
    envelope = event_envelope(
        event_id=event_id,
        sender=sender,
        key=public_key_text(key.public_key()),
        content=content,
        selector=selector,
        channel=channel,
        lifetime_s=lifetime_s,
        signed_at=signed_at,
    )
    return {"id": event_id, "signed_at": signed_at, "signature": sign(key, envelope)}


def signed_attestations(
    key: Ed25519PrivateKey,
    *,
    authority: str,
    client: str,
    client_key: str,
    values: Mapping[str, Any],
    expires_at: Optional[int],
    now: float,
) -> Dict[str, Any]:
    """What an authority's own tooling adds to an attestation request to sign each of
    its values for `client` and its key (the console's `POST .../attestations` takes
    `signed_at` and `signatures`). `expires_at`: whole Unix seconds, or None."""
    signed_at = int(now)
    given = {}
    for name, value in values.items():
        body = attestation_body(
            {"authority": authority, "client": client, "client_key": client_key, "name": name,
             "value": value, "expires_at": expires_at, "signed_at": signed_at}
        )  # fmt: skip
        given[name] = sign(key, body)
    return {"signed_at": signed_at, "signatures": given}


def trusted_keys(keys: Iterable[str]) -> Tuple[str, ...]:
    """Public keys as configured, each checked (ValueError naming a bad one)."""
    checked = tuple(keys)
    for key in checked:
        public_key(key)
    return checked
