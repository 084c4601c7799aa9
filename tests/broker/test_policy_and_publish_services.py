"""Policies are versioned and refused whole; events carry attested sender attributes."""

import pytest

from broker.audit import Actor
from broker.errors import InvalidInput, NotAuthorised, PolicyRejected
from broker.models import AuditEntry, Event
from broker.scenario import WEB_SERVER_POLICY, load_scenario
from broker.services.events import publish_event
from broker.services.policies import set_policy

pytestmark = pytest.mark.django_db(databases=["default", "audit"])


@pytest.fixture
def scenario():
    # These tests never commit, so nothing is routed: they stop at the accepted event.
    return load_scenario(servers=4)


def test_policies_are_versioned_with_who_changed_them(scenario):
    server = scenario.servers[0]
    second = set_policy(
        client=server, text='accept event.kind == "command"', actor=Actor("user", "olivia")
    )
    assert second.version == 2
    assert second.created_by == "user:olivia"
    assert server.policy_versions.get(version=1).text == WEB_SERVER_POLICY


def test_a_policy_with_an_error_is_refused_whole_with_its_position(scenario):
    server = scenario.servers[0]
    with pytest.raises(PolicyRejected) as refused:
        set_policy(
            client=server, text="accept event.threat_level >=", actor=Actor("user", "olivia")
        )
    assert (refused.value.line, refused.value.field) == (1, "policy")
    assert refused.value.column > 1
    assert server.policy_versions.count() == 1
    assert AuditEntry.objects.using("audit").filter(action="policy.set", outcome="refused").exists()


def test_an_event_records_the_senders_attested_attributes(scenario):
    sender = scenario.controllers["northwest-controller"]
    event = publish_event(sender=sender, content={"alert": "worm", "threat_level": 4})
    assert event.sender_attributes == {
        "organization": "Government",
        "scope": "regional",
        "region": "Northwest",
        "trust": 2,
    }


def test_sequence_numbers_count_per_sender_and_channel(scenario):
    sender = scenario.controllers["northwest-controller"]
    numbers = [
        publish_event(sender=sender, content={"n": n}, channel=channel).sequence
        for n, channel in enumerate(["a", "a", "b", "a"])
    ]
    assert numbers == [1, 2, 1, 3]


@pytest.mark.parametrize("forged", ["sender.trust", "sender"])
def test_content_posing_as_sender_attributes_is_refused_and_audited(scenario, forged):
    sender = scenario.controllers["rogue-controller"]
    with pytest.raises(NotAuthorised) as refused:
        publish_event(sender=sender, content={"alert": "worm", forged: 3})
    assert refused.value.field == f"content.{forged}"
    assert not Event.objects.exists()
    entry = AuditEntry.objects.using("audit").get(action="event.publish")
    assert entry.outcome == "refused" and entry.actor == "client:rogue-controller"


def test_a_receiver_only_client_may_not_send(scenario):
    with pytest.raises(NotAuthorised):
        publish_event(sender=scenario.servers[0], content={"kind": "command"})


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"content": {}}, "content"),
        ({"content": {"kind": [1]}}, "content.kind"),
        ({"content": {"kind": "x"}, "lifetime_s": 0}, "lifetime_s"),
        ({"content": {"kind": "x"}, "channel": "a b"}, "channel"),
    ],
)
def test_malformed_events_are_refused_by_field(scenario, kwargs, field):
    with pytest.raises(InvalidInput) as refused:
        publish_event(sender=scenario.controllers["intellimune-national"], **kwargs)
    assert refused.value.field == field


def test_a_selector_with_an_error_is_refused_with_its_position(scenario):
    with pytest.raises(PolicyRejected) as refused:
        publish_event(
            sender=scenario.controllers["intellimune-national"],
            content={"kind": "command"},
            selector='software == "IIS" and',
        )
    assert refused.value.field == "selector"
