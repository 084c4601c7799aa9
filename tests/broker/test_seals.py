"""Seals: the console signs operators' sends and authorities' attestations with the keys
it holds, and checks the signatures senders bring (broker/seals.py)."""

from __future__ import annotations

import json
import time
import uuid
from datetime import timedelta

import pytest
from django.test import Client as HttpClient
from django.utils import timezone
from sn_agent.signatures import (
    SealRefused,
    new_private_key,
    public_key_text,
    signed_attestations,
    signed_publish,
    verify_seal,
)

from broker.errors import InvalidInput
from broker.models import AttributeValue, Event
from broker.seals import SigningKeyUnusable
from broker.services.events import SenderSignature, publish_event
from broker.services.signing_keys import (
    make_authority_key,
    make_sender_key,
    set_authority_key,
    set_signing_key,
)
from broker.services.trust import attest_for_clients, renew_for_clients
from demo.scenario import load_scenario
from tests.broker.agent_helpers import ISSUER

pytestmark = pytest.mark.django_db(databases=["default", "audit"])

COMMAND = {"kind": "command", "action": "disable-cgi"}
NATIONAL = "intellimune-national"


@pytest.fixture
def scenario():
    return load_scenario(servers=2)


@pytest.fixture
def trust_keys(scenario) -> dict:
    """The authorities an agent would trust: the console holds the trust manager's key."""
    return {"trust-manager": [make_authority_key(authority=scenario.trust_manager, actor=ISSUER)]}


def verified(event: Event, authorities: dict):
    stored = Event.objects.get(pk=event.pk)
    return verify_seal(
        stored.seal,
        event_id=str(stored.pk),
        content=stored.content,
        channel=stored.channel,
        authorities=authorities,
        now=time.time(),
    )


def test_an_operators_send_is_signed_and_carries_the_attestations_of_its_sender(
    scenario, trust_keys
):
    national = scenario.controllers[NATIONAL]
    make_sender_key(client=national, actor=ISSUER)

    event = publish_event(sender=national, content=COMMAND, channel="c", console_signs=True)

    assert verified(event, trust_keys).sender_attributes == event.sender_attributes
    assert event.sender_attributes == {
        "organization": "Intellimune", "scope": "national", "region": "National", "trust": 3
    }  # fmt: skip


def test_without_the_senders_key_the_console_sends_unsigned(scenario, trust_keys):
    event = publish_event(
        sender=scenario.controllers[NATIONAL], content=COMMAND, console_signs=True
    )

    assert Event.objects.get(pk=event.pk).seal is None
    with pytest.raises(SealRefused, match="not signed"):
        verified(event, trust_keys)


def test_a_key_file_that_is_not_the_senders_key_is_refused_saying_what_to_do(scenario):
    national = scenario.controllers[NATIONAL]
    make_sender_key(client=national, actor=ISSUER)
    other = public_key_text(new_private_key().public_key())
    set_signing_key(client=national, public_key=other, actor=ISSUER)

    with pytest.raises(SigningKeyUnusable, match=r"manage\.py signing_key sender"):
        publish_event(sender=national, content=COMMAND, console_signs=True)


def test_a_sender_that_signs_its_own_events_keeps_its_id_and_a_bad_signature_is_refused(
    scenario, trust_keys
):
    national = scenario.controllers[NATIONAL]
    own_key = new_private_key()  # kept by the sender, never by the console
    set_signing_key(client=national, public_key=public_key_text(own_key.public_key()), actor=ISSUER)
    signed = signed_publish(own_key, sender=NATIONAL, content=COMMAND, selector="",
                            channel="c", lifetime_s=60, now=time.time())  # fmt: skip
    signature = SenderSignature(signed["id"], signed["signed_at"], signed["signature"])

    event = publish_event(sender=national, content=COMMAND, channel="c", signed=signature)

    assert str(event.pk) == signed["id"] and verified(event, trust_keys).sender == NATIONAL
    with pytest.raises(InvalidInput, match="was published already") as again:
        publish_event(sender=national, content=COMMAND, channel="c", signed=signature)
    assert again.value.field == "id"
    changed = SenderSignature(str(uuid.uuid4()), signed["signed_at"], signed["signature"])
    with pytest.raises(InvalidInput, match="signature does not hold") as forged:
        publish_event(sender=national, content=COMMAND, channel="c", signed=changed)
    assert forged.value.field == "signature"


def test_an_attestation_is_signed_again_when_renewed_and_a_value_changed_in_the_database_fails(
    scenario, trust_keys
):
    national = scenario.controllers[NATIONAL]
    make_sender_key(client=national, actor=ISSUER)
    authority = scenario.trust_manager
    attest_for_clients(authority=authority, clients=[national], values={"trust": 2},
                       expires_at=None, actor=ISSUER)  # fmt: skip
    renew_for_clients(authority=authority, clients=[national], names=["trust"],
                      expires_at=_in_days(3), actor=ISSUER)  # fmt: skip
    seal = AttributeValue.objects.get(client=national, name="trust").seal
    assert seal["value"] == 2 and seal["expires_at"] > time.time() + 2 * 86400
    # Whoever writes the database raises the value; the signature stays the old one's.
    AttributeValue.objects.filter(client=national, name="trust").update(
        value=3, seal={**seal, "value": 3}
    )

    event = publish_event(sender=national, content=COMMAND, console_signs=True)

    checked = verified(event, trust_keys)
    assert "trust" not in checked.sender_attributes
    assert any("trust from trust-manager" in why for why in checked.set_aside)


def _in_days(days: int):
    return timezone.now() + timedelta(days=days)


def test_an_authority_signing_with_its_own_tooling_has_its_signatures_kept_or_refused(scenario):
    national = scenario.controllers[NATIONAL]
    make_sender_key(client=national, actor=ISSUER)
    national.refresh_from_db()
    own_key = new_private_key()  # the trust manager's, never given to the console
    own_public = public_key_text(own_key.public_key())
    set_authority_key(authority=scenario.trust_manager, public_key=own_public, actor=ISSUER)
    key_reply = _as_trust_manager(scenario, "get", f"/api/v1/clients/{NATIONAL}/signing-key")
    assert key_reply.json()["signing_key"] == national.signing_key
    signed = signed_attestations(
        own_key, authority="trust-manager", client=NATIONAL, client_key=national.signing_key,
        values={"trust": 2}, expires_at=None, now=time.time(),
    )  # fmt: skip

    forged = {**signed, "signatures": {"trust": signed["signatures"]["trust"][::-1]}}
    refused = _attest(scenario, {"trust": 2}, forged)
    kept = _attest(scenario, {"trust": 2}, signed)

    assert refused.status_code == 400 and refused.json()["field"] == "signatures.trust"
    assert kept.status_code == 200
    event = publish_event(sender=national, content=COMMAND, console_signs=True)
    assert verified(event, {"trust-manager": [own_public]}).sender_attributes == {"trust": 2}


def _as_trust_manager(scenario, method: str, path: str, body=None):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {scenario.secrets['trust-manager']}"}
    if body is None:
        return getattr(HttpClient(), method)(path, **headers)
    return HttpClient().post(path, json.dumps(body), content_type="application/json", **headers)


def _attest(scenario, values: dict, signed: dict):
    grant = scenario.grants[(NATIONAL, "trust-manager")]
    body = {"grant_key": grant, "values": values, **signed}
    return _as_trust_manager(scenario, "post", f"/api/v1/clients/{NATIONAL}/attestations", body)
