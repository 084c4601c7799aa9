"""An attacker who can write PostgreSQL and the Redis that carries pushes, but holds no
private key, cannot make an agent that verifies run anything (docs/security.md,
"Signed events"). A real `sn-agent run` with [trust], a real Uvicorn and Celery worker;
the forgeries are written straight into the database and Redis."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone
from sn_agent.journal import Journal
from sn_agent.signatures import event_envelope, new_private_key, public_key_text, sign

from broker.models import Client, Delivery, Event, ReceiverStream
from broker.push.to_agents import Pushed, push
from broker.services.events import publish_event
from broker.services.signing_keys import make_authority_key, make_sender_key
from demo.scenario import WEB_SERVER_POLICY
from tests.agent.running_agent import SERVER, wait_answered
from tests.broker.agent_helpers import ISSUER, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

SENDER = "intellimune-national"


@pytest.fixture
def verifying_agent(agent, web_server):
    """web-00000's agent trusting the trust manager's key; the console holds that key
    and the national controller's, so that operators' sends to it are signed."""
    scenario, _ = web_server
    authority_key = make_authority_key(authority=scenario.trust_manager, actor=ISSUER)
    for sender in (SENDER, "northwest-controller"):
        make_sender_key(client=scenario.controllers[sender], actor=ISSUER)
    (agent.folder / "policy").write_text(WEB_SERVER_POLICY)
    trust = f'[trust]\nauthorities = {{ trust-manager = ["{authority_key}"] }}\n'
    agent.config.write_text(f'policy_file = "policy"\n{agent.config.read_text()}\n{trust}')
    agent.start()
    return agent


def signed_command(web_server, action: str, *, sender=SENDER, to=SERVER) -> Event:
    """A command as an operator's send publishes it: signed by the console."""
    scenario, _ = web_server
    return publish_event(
        sender=scenario.controllers[sender],
        content={"kind": "command", "action": action},
        selector=f'receiver.hostname == "{to}"',
        lifetime_s=300,
        channel="commands",
        console_signs=True,
    )


def refusal_of(event: Event) -> str:
    delivery = wait_answered(event)
    assert delivery.state == "failed", delivery.result
    return delivery.result["error"]


def test_a_signed_command_runs_and_an_unsigned_one_is_refused_without_running(
    verifying_agent, web_server
):
    genuine = signed_command(web_server, "disable-cgi")
    assert wait_answered(genuine).state == "acked"
    scenario, _ = web_server
    unsigned = publish_event(  # what a stolen sender token, or the API unsigned, publishes
        sender=scenario.controllers[SENDER],
        content={"kind": "command", "action": "disable-cgi"},
        selector=f'receiver.hostname == "{SERVER}"',
        channel="commands",
    )

    assert "not acted on: the event is not signed by its sender" in refusal_of(unsigned)
    assert [r["event"] for r in verifying_agent.recorded()] == [str(genuine.pk)]


def test_forged_events_and_deliveries_written_in_postgresql_run_nothing(
    verifying_agent, web_server
):
    genuine = signed_command(web_server, "disable-cgi")
    wait_answered(genuine)
    verifying_agent.stop()
    # Written straight into the tables, as whoever holds the database's password would:
    changed = forged_event(genuine, content={"kind": "command", "action": "slow"})
    own_id = uuid.uuid4()
    own_key = forged_event(genuine, id=own_id, seal=self_signed_seal(genuine, own_id))
    deliveries = [forged_delivery(changed), forged_delivery(own_key), redelivered(genuine)]
    verifying_agent.start()  # its login replays what it has not seen

    wait_for(lambda: all(answered(d) for d in deliveries), "every forgery was answered")
    errors = [Delivery.objects.get(pk=d.pk).result["error"] for d in deliveries]
    assert "signature of intellimune-national does not hold" in errors[0]
    assert "no authority this agent trusts attests intellimune-national" in errors[1]
    assert f"event {genuine.pk} was handed over before" in errors[2]
    assert [r["event"] for r in verifying_agent.recorded()] == [str(genuine.pk)]


def test_forged_pushes_through_redis_run_nothing(verifying_agent, web_server):
    genuine = signed_command(web_server, "disable-cgi")
    wait_answered(genuine)
    position = ReceiverStream.objects.get(client__name=SERVER).last_position
    receiver = Delivery.objects.get(event=genuine).receiver_id
    seal = Event.objects.get(pk=genuine.pk).seal
    # Pushes written to Redis, with no row behind them, each with a seal of its own.
    push([
        forged_push(genuine, receiver, position + 1, {"action": "slow"}, seal, new_id=True),
        forged_push(genuine, receiver, position + 2, genuine.content, None, new_id=True),
        forged_push(genuine, receiver, position + 3, genuine.content, seal),
    ])  # fmt: skip

    output = stopped_after_refusals(verifying_agent, 3)
    assert "does not hold" in output and "not signed by its sender" in output
    assert "was handed over before" in output
    assert [r["event"] for r in verifying_agent.recorded()] == [str(genuine.pk)]


def test_a_genuine_event_delivered_where_its_sender_or_the_policy_did_not_agree_runs_nothing(
    verifying_agent, web_server
):
    # Genuine, signed events: one addressed to the other server, one from a sender this
    # server's policy does not accept commands from. The console delivers neither here;
    # whoever writes its database does.
    elsewhere = signed_command(web_server, "disable-cgi", to="web-00001")
    refused_sender = signed_command(web_server, "disable-cgi", sender="northwest-controller")
    wait_for(lambda: Event.objects.filter(routed_at__isnull=False).count() >= 2, "routed")
    verifying_agent.stop()
    deliveries = [forged_delivery(elsewhere), forged_delivery(refused_sender)]
    verifying_agent.start()

    wait_for(lambda: all(answered(d) for d in deliveries), "both were answered")
    errors = [Delivery.objects.get(pk=d.pk).result["error"] for d in deliveries]
    assert 'its selector does not select this server: receiver.hostname == "web-00001"' in errors[0]
    assert "this server's policy does not accept it from northwest-controller" in errors[1]
    assert verifying_agent.recorded() == []


# The attacker's moves --------------------------------------------------------------------


def forged_event(genuine: Event, **changes) -> Event:
    fields = {
        field.attname: getattr(genuine, field.attname) for field in Event._meta.concrete_fields
    }
    taken = Event.objects.filter(sender_id=genuine.sender_id, channel=genuine.channel).count()
    fields.update(id=uuid.uuid4(), sequence=genuine.sequence + 100 + taken, idempotency_key="")
    fields.update(published_at=timezone.now(), expires_at=timezone.now() + timedelta(hours=1))
    fields.pop("txid")
    fields.update(changes)
    if "seal" not in changes:
        fields["seal"] = genuine.seal
    return Event.objects.create(**fields)


def self_signed_seal(genuine: Event, event_id: uuid.UUID) -> dict:
    """A seal signed with a key of the attacker's, named as the sender's own (and the
    genuine event's attestations, which bind the sender's real key)."""
    key = new_private_key()
    fields = {**genuine.seal, "key": public_key_text(key.public_key())}
    envelope = event_envelope(
        event_id=str(event_id), content=genuine.content, channel=genuine.channel,
        **{k: fields[k] for k in ("sender", "key", "selector", "lifetime_s", "signed_at")},
    )  # fmt: skip
    return {**fields, "signature": sign(key, envelope)}


def next_position() -> int:
    stream, _ = ReceiverStream.objects.get_or_create(client=Client.objects.get(name=SERVER))
    stream.last_position += 1
    stream.save()
    return stream.last_position


def forged_delivery(event: Event) -> Delivery:
    return Delivery.objects.create(
        event=event, receiver=Client.objects.get(name=SERVER), sender_id=event.sender_id,
        channel=event.channel,
        sequence=event.sequence, position=next_position(), delivered_at=timezone.now(),
    )  # fmt: skip


def redelivered(genuine: Event) -> Delivery:
    """The genuine event's delivery, moved to a new position as if never answered."""
    delivery = Delivery.objects.get(event=genuine)
    Delivery.objects.filter(pk=delivery.pk).update(
        position=next_position(), state=Delivery.State.PENDING, acked_at=None, result=None
    )
    return delivery


def answered(delivery: Delivery) -> bool:
    return Delivery.objects.get(pk=delivery.pk).state in ("acked", "failed")


def forged_push(genuine, receiver, position, content, seal, *, new_id=False) -> Pushed:
    event_id = str(uuid.uuid4()) if new_id else str(genuine.pk)
    return Pushed(
        delivery_id=10**9 + position, position=position, receiver_id=receiver,
        event_id=event_id, sender_id=genuine.sender_id, channel=genuine.channel,
        sequence=genuine.sequence, content=content, seal=seal, seal_read=True,
    )  # fmt: skip


def stopped_after_refusals(agent, count: int) -> str:
    """The agent's output once it has refused `count` notifications (it is stopped)."""
    refusals = agent.folder / "state"
    wait_for(lambda: _refused_in_journal(refusals) >= count, f"{count} refusals")
    return agent.stop()


def _refused_in_journal(state_dir) -> int:
    journal = Journal(state_dir, read_only=True)
    try:
        return sum(1 for e in journal.latest(50) if "not acted on" in str(e.result))
    finally:
        journal.db.close()
