"""The attacker's moves: what whoever holds the database's password, or can write the
Redis that carries pushes, but no private key, can do to an agent. Shared by the
agent's forgery and replay tests."""

from __future__ import annotations

import uuid
from datetime import timedelta

from django.db.models import Max
from django.utils import timezone
from sn_agent.journal import Journal
from sn_agent.signatures import event_envelope, new_private_key, public_key_text, sign

from broker.models import Client, Delivery, Event, ReceiverStream
from broker.push.to_agents import Pushed
from tests.agent.running_agent import SERVER
from tests.broker.agent_helpers import wait_for


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


def next_position(count: int = 1) -> int:
    """The first of `count` positions taken at the end of web-00000's stream."""
    stream, _ = ReceiverStream.objects.get_or_create(client=Client.objects.get(name=SERVER))
    stream.last_position += count
    stream.save()
    return stream.last_position - count + 1


def forged_delivery(event: Event) -> Delivery:
    return Delivery.objects.create(
        event=event, receiver=Client.objects.get(name=SERVER), sender_id=event.sender_id,
        channel=event.channel,
        sequence=event.sequence, expires_at=event.expires_at, position=next_position(),
        delivered_at=timezone.now(),
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


def junk_deliveries(genuine: Event, count: int) -> list[Delivery]:
    """`count` forged deliveries of unsigned events, each of its own, at the next
    positions of web-00000's stream: junk that pushes the genuine delivery out of the
    deliveries the agent's journal keeps."""
    fields = {f.attname: getattr(genuine, f.attname) for f in Event._meta.concrete_fields}
    fields.pop("txid")
    now = timezone.now()
    fields.update(seal=None, idempotency_key="", published_at=now)
    fields.update(expires_at=now + timedelta(hours=1))
    stream = Event.objects.filter(sender_id=genuine.sender_id, channel=genuine.channel)
    after = stream.aggregate(Max("sequence"))["sequence__max"] + 10_000  # far ahead
    events = Event.objects.bulk_create(
        Event(**{**fields, "id": uuid.uuid4(), "sequence": after + n}) for n in range(count)
    )
    receiver = Client.objects.get(name=SERVER)
    first = next_position(count)
    return Delivery.objects.bulk_create(
        Delivery(event=event, receiver=receiver, sender_id=event.sender_id, channel=event.channel,
                 sequence=event.sequence, expires_at=event.expires_at, position=first + n,
                 delivered_at=now)
        for n, event in enumerate(events)
    )  # fmt: skip
