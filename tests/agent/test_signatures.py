"""What an agent checks of a notification's seal before it acts (sn_agent.signatures):
the sender's signature over all it acts on, and the authorities' over each attribute."""

from __future__ import annotations

import random

import pytest
from sn_agent.signatures import (
    SealRefused,
    attestation_body,
    event_envelope,
    new_private_key,
    public_key_text,
    sign,
    verify_seal,
)

NOW = 1_800_000_000
EVENT = "5b0f8f7e-3c1a-4d7e-9a51-0f2b9c7d1e22"
CONTENT = {"kind": "command", "action": "shutdown", "note": "⟨ä⟩ \u202e"}
SENDER_KEY, AUTHORITY_KEY, OTHER_KEY = new_private_key(), new_private_key(), new_private_key()
SENDER_PUBLIC = public_key_text(SENDER_KEY.public_key())
AUTHORITIES = {"trust-manager": [public_key_text(AUTHORITY_KEY.public_key())]}


def attestation(name, value, *, key=AUTHORITY_KEY, expires_at=None, **changes) -> dict:
    fields = {
        "authority": "trust-manager",
        "client": "intellimune-national",
        "client_key": SENDER_PUBLIC,
        "name": name,
        "value": value,
        "expires_at": expires_at,
        "signed_at": NOW - 3600,
        **changes,
    }
    return {**fields, "signature": sign(key, attestation_body(fields))}


def seal(*, signer=SENDER_KEY, content=CONTENT, attestations=None, **changes) -> dict:
    fields = {
        "sender": "intellimune-national",
        "key": SENDER_PUBLIC,
        "selector": 'hostname == "web-00000"',
        "lifetime_s": 600,
        "signed_at": NOW - 10,
        **changes,
    }
    envelope = event_envelope(event_id=EVENT, content=content, channel="commands", **fields)
    if attestations is None:
        attestations = [attestation("organization", "Intellimune"), attestation("trust", 3)]
    return {**fields, "signature": sign(signer, envelope), "attestations": attestations}


def verify(given, *, content=CONTENT, event_id=EVENT, channel="commands", now=NOW, **kwargs):
    kwargs.setdefault("authorities", AUTHORITIES)
    return verify_seal(
        given, event_id=event_id, content=content, channel=channel, now=now, **kwargs
    )


def test_a_signed_event_holds_and_its_sender_has_what_the_authority_attested():
    verified = verify(seal())

    assert verified.sender == "intellimune-national"
    assert verified.sender_attributes == {"organization": "Intellimune", "trust": 3}
    assert verified.set_aside == ()


@pytest.mark.parametrize(
    "changed",
    [
        {"content": {**CONTENT, "action": "status"}},
        {"event_id": "00000000-0000-4000-8000-000000000000"},
        {"channel": "alerts"},
    ],
    ids=["content", "event id", "channel"],
)
def test_changing_anything_the_receiver_acts_on_breaks_the_senders_signature(changed):
    with pytest.raises(SealRefused, match="signature of intellimune-national does not hold"):
        verify(seal(), **changed)


@pytest.mark.parametrize(
    "field, value",
    [("selector", "true"), ("lifetime_s", 604800), ("signed_at", NOW), ("sender", "rogue")],
)
def test_changing_the_seals_own_fields_breaks_the_signature(field, value):
    forged = {**seal(), field: value}

    with pytest.raises(SealRefused, match="does not hold"):
        verify(forged)


def test_a_key_put_in_by_whoever_writes_the_database_signs_nothing_that_holds():
    # The attacker signs with a key of their own and names it as the sender's: the
    # signature holds for that key, but no authority attested anything for it.
    forger = new_private_key()
    forged = seal(signer=forger, key=public_key_text(forger.public_key()))

    with pytest.raises(SealRefused, match=r"no authority this agent trusts attests .* key"):
        verify(forged)


def test_an_unsigned_or_malformed_seal_is_refused_with_a_reason():
    with pytest.raises(SealRefused, match="not signed by its sender"):
        verify(None)
    with pytest.raises(SealRefused, match="lacks signature"):
        verify({k: v for k, v in seal().items() if k != "signature"})
    with pytest.raises(SealRefused, match="lifetime_s that is not a whole number"):
        verify({**seal(), "lifetime_s": "600"})


def test_an_event_past_its_lifetime_or_signed_in_the_future_is_refused():
    with pytest.raises(SealRefused, match="lifetime was over"):
        verify(seal(), now=NOW + 600 + 400)
    with pytest.raises(SealRefused, match="signed in the future"):
        verify(seal(signed_at=NOW + 3600))


@pytest.mark.parametrize(
    "forged, why",
    [
        (attestation("trust", 3, key=OTHER_KEY), "the authority's signature does not hold"),
        ({**attestation("trust", 1), "value": 3}, "the authority's signature does not hold"),
        (attestation("trust", 3, authority="self-made"), "not an authority this agent trusts"),
        (attestation("trust", 3, client="rogue-controller"), "another client or another key"),
        (attestation("trust", 3, expires_at=NOW - 60), "had expired when the event was signed"),
        ({"name": "trust"}, "lacks fields"),
    ],
    ids=["other key", "changed value", "unknown authority", "other client", "expired", "partial"],
)
def test_an_attestation_that_does_not_hold_counts_for_nothing(forged, why):
    verified = verify(seal(attestations=[attestation("organization", "Intellimune"), forged]))

    assert verified.sender_attributes == {"organization": "Intellimune"}
    assert len(verified.set_aside) == 1 and why in verified.set_aside[0]


def test_during_a_rotation_the_old_and_the_new_authority_key_both_hold():
    new_key = new_private_key()
    both = {"trust-manager": [*AUTHORITIES["trust-manager"], public_key_text(new_key.public_key())]}
    old_and_new = [
        attestation("organization", "Intellimune"),
        attestation("trust", 3, key=new_key),
    ]

    verified = verify(seal(attestations=old_and_new), authorities=both)

    assert verified.sender_attributes == {"organization": "Intellimune", "trust": 3}


def test_of_two_attestations_of_one_name_the_newest_holds():
    older = attestation("trust", 1, signed_at=NOW - 7200)
    newer = attestation("trust", 2, signed_at=NOW - 60)

    assert verify(seal(attestations=[newer, older])).sender_attributes == {"trust": 2}


def test_garbage_in_any_field_of_a_seal_is_refused_never_raised_otherwise():
    rng = random.Random(31)
    junk = [None, 0, -1, 2**70, 1.5, True, "", "x" * 300, [], {}, ["a"], {"a": 1}, "ed25519:AA=="]
    genuine = seal()
    for _ in range(400):
        forged = dict(genuine)
        for name in rng.sample(sorted(genuine), rng.randint(1, 3)):
            forged[name] = rng.choice(junk)
        if rng.random() < 0.3:
            forged["attestations"] = [rng.choice(junk), {**attestation("trust", 3), "value": []}]
        try:
            verified = verify(forged)
        except SealRefused:
            continue
        assert verified.sender == genuine["sender"]  # only the untouched fields can hold
