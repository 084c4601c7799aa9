"""The real tree against a brute-force oracle: random clients, attributes and policies
changing while events are published, ordered streams, and a worker killed mid-stream."""

import random

import pytest
from django.db.models import Count

from broker.audit import Actor
from broker.models import Delivery, Event
from broker.services.authorities import attest_attributes, create_authority, grant_authority
from broker.services.clients import (
    AttributeSpec,
    create_client_model,
    register_client,
    state_attributes,
)
from broker.services.event_attributes import EventAttributeSpec, declare_event_attributes
from broker.services.events import publish_event
from broker.services.policies import set_policy
from tests.broker.tree_helpers import wait_until_idle
from tests.broker.tree_oracle import delivered, matching, receiver_states

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "audit"])
SETUP = Actor("system", "test")
KINDS = ("alpha", "beta", "gamma")
ZONES = ("north", "south", "east")


class World:
    """200+ receivers and a few senders with random attributes and policies."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        declare_event_attributes(
            attributes=[EventAttributeSpec("kind", "string"), EventAttributeSpec("level", "int")],
            actor=SETUP,
        )
        self.node_model = create_client_model(
            name="node",
            attributes=[
                AttributeSpec("kind", "string"),
                AttributeSpec("level", "int"),
                AttributeSpec("flag", "bool"),
                AttributeSpec("zone", "string", self_stated=False),
            ],
            actor=SETUP,
        )
        sender_model = create_client_model(
            name="sender",
            attributes=[
                AttributeSpec("org", "string", False),
                AttributeSpec("trust", "int", False),
            ],
            actor=SETUP,
        )
        self.registry, _ = create_authority(
            name="registry",
            display_name="Registry",
            capabilities=[
                *self.node_model.attributes.filter(name="zone"),
                *sender_model.attributes.all(),
            ],
            actor=SETUP,
        )
        self.grants = {}
        self.receivers = []
        self.senders = [self._sender(sender_model, index) for index in range(4)]

    def _sender(self, model, index: int):
        client, _ = register_client(
            name=f"sender-{index}", model=model, can_send=True, can_receive=False, actor=SETUP
        )
        grant = grant_authority(client=client, authority=self.registry, actor=SETUP)
        values = {"org": self.rng.choice(["X", "Y"]), "trust": index}
        attest_attributes(authority=self.registry, client=client, grant_key=grant, values=values)
        return client

    def add_receiver(self) -> None:
        name = f"node-{len(self.receivers):04d}"
        client, _ = register_client(
            name=name, model=self.node_model, can_send=False, can_receive=True, actor=SETUP
        )
        self.grants[client.id] = grant_authority(
            client=client, authority=self.registry, actor=SETUP
        )
        state_attributes(client=client, values=self.random_attributes(), actor=SETUP)
        self.attest_zone(client)
        set_policy(client=client, text=self.random_policy(), actor=SETUP)
        self.receivers.append(client)

    def attest_zone(self, client) -> None:
        zone = {"zone": self.rng.choice(ZONES)}
        attest_attributes(
            authority=self.registry, client=client, grant_key=self.grants[client.id], values=zone
        )

    def random_attributes(self) -> dict:
        return {
            "kind": self.rng.choice(KINDS),
            "level": self.rng.randrange(10),
            "flag": self.rng.random() < 0.5,
        }

    def random_policy(self) -> str:
        trust = self.rng.randrange(4)
        kind = self.rng.choice(KINDS)
        level = self.rng.randrange(10)
        org = self.rng.choice(["X", "Y"])
        return (
            f'accept (sender.trust >= {trust} and event.kind == "{kind}")'
            f' or (sender.org == "{org}" and event.level <= {level})'
        )

    def random_selector(self) -> str:
        return self.rng.choice(
            [
                "",
                f'kind == "{self.rng.choice(KINDS)}"',
                f"level >= {self.rng.randrange(10)} and flag == true",
                f'zone in ["{self.rng.choice(ZONES)}", "{self.rng.choice(ZONES)}"]',
                f'not (kind == "{self.rng.choice(KINDS)}") and level < {self.rng.randrange(10)}',
            ]
        )

    def change_someone(self, spared: set[int] | None = None) -> None:
        """One change to one receiver not in `spared`: attributes, attested zone, or policy.

        The chosen receiver joins `spared`: a receiver changed twice between two oracle
        snapshots would pass through a state the oracle never sees.
        """
        spared = set() if spared is None else spared
        client = self.rng.choice([r for r in self.receivers if r.id not in spared])
        spared.add(client.id)
        choice = self.rng.randrange(3)
        if choice == 0:
            state_attributes(client=client, values=self.random_attributes(), actor=SETUP)
        elif choice == 1:
            self.attest_zone(client)
        else:
            set_policy(client=client, text=self.random_policy(), actor=SETUP)

    def publish(self, channel: str) -> Event:
        content = {"kind": self.rng.choice(KINDS), "level": self.rng.randrange(10)}
        return publish_event(
            sender=self.rng.choice(self.senders),
            content=content,
            selector=self.random_selector(),
            lifetime_s=600,
            channel=channel,
        )


def test_random_changes_while_publishing_deliver_exactly_what_the_oracle_says(celery_worker):
    world = World(seed=2026)
    for _ in range(200):
        world.add_receiver()
    wait_until_idle(timeout_s=120)
    published: list[tuple[Event, int]] = []
    states = []
    for round_number in range(6):
        # Each receiver changes at most once per round, so it has one state per round.
        changed: set[int] = set()
        for _ in range(40):
            world.change_someone(changed)
        if round_number == 3:
            for _ in range(10):  # clients that connect later still get live events
                world.add_receiver()
        states.append(receiver_states())
        for index in range(8):  # a channel per event: no ordering between them here
            published.append((world.publish(f"r{round_number}-e{index}"), round_number))
        wait_until_idle(timeout_s=120)
    for event, round_number in published:
        expected = set().union(*(matching(event, s) for s in states[round_number:]))
        assert delivered(event) == expected, f"event {event.channel}"
    assert sum(len(delivered(e)) for e, _ in published) > 100  # the test is not vacuous


def test_a_stream_reaches_every_receiver_in_order_even_when_receivers_change_midway(
    celery_worker,
):
    world = World(seed=7)
    for _ in range(40):
        world.add_receiver()
    wait_until_idle(timeout_s=60)
    sender = world.senders[3]
    events = []
    for number in range(30):
        content = {"kind": "alpha", "level": number % 10}
        events.append(
            publish_event(sender=sender, content=content, lifetime_s=600, channel="stream")
        )
        if number % 10 == 5:
            for _ in range(5):
                world.change_someone(set())
    wait_until_idle(timeout_s=60)
    assert_in_order_without_duplicates(sender)


def assert_in_order_without_duplicates(sender) -> None:
    per_receiver: dict[int, list[int]] = {}
    for receiver_id, sequence in (
        Delivery.objects.filter(sender=sender).order_by("id").values_list("receiver_id", "sequence")
    ):
        per_receiver.setdefault(receiver_id, []).append(sequence)
    assert per_receiver
    for sequences in per_receiver.values():
        assert sequences == sorted(set(sequences))


def test_a_worker_killed_mid_stream_loses_no_delivery(celery_worker):
    world = World(seed=11)
    for _ in range(40):
        world.add_receiver()
    wait_until_idle(timeout_s=60)
    states = receiver_states()
    sender = world.senders[3]
    events = [
        publish_event(
            sender=sender, content={"kind": "beta", "level": n % 10}, lifetime_s=600, channel="kill"
        )
        for n in range(40)
    ]
    _wait_for_first_delivery()
    celery_worker.kill_hard()
    at_kill = Delivery.objects.count()
    celery_worker.start()
    wait_until_idle(timeout_s=120)
    for event in events:
        assert delivered(event) == matching(event, states)
    assert at_kill < Delivery.objects.count()  # the kill did interrupt the stream
    duplicates = (
        Delivery.objects.values("event", "receiver").annotate(n=Count("id")).filter(n__gt=1)
    )
    assert not duplicates.exists()
    assert_in_order_without_duplicates(sender)


def _wait_for_first_delivery(timeout_s: float = 30.0) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while not Delivery.objects.exists():
        assert time.monotonic() < deadline, "nothing was delivered before the kill"
        time.sleep(0.01)
