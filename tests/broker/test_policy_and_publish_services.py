"""Policies are versioned and refused whole; events carry attested sender attributes."""

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from broker.audit import Actor
from broker.dispatch.consumer import StatementCounter
from broker.errors import InvalidInput, NotAuthorised, PolicyRejected
from broker.models import AttributeValue, AuditEntry, Event, EventAttribute
from broker.services import events
from broker.services.events import publish_event
from broker.services.policies import set_policy
from demo.scenario import WEB_SERVER_POLICY
from tests.module_data import copy_for_the_test, scenario_for_the_module

pytestmark = pytest.mark.django_db(databases=["default", "audit"])


# These tests never commit, so nothing is routed: they stop at the accepted event.
loaded_scenario = scenario_for_the_module(servers=4)


@pytest.fixture
def scenario(loaded_scenario):
    return copy_for_the_test(loaded_scenario)


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


# Typed addressing: texts are typed by the vocabulary when saved or published --------

ILL_TYPED_POLICIES = {
    "quoted trust": (
        'accept sender.trust >= "2"',
        (1, 24),
        "expected a whole number for 'sender.trust' (int), found \"2\": write 2 without quotes",
    ),
    "quoted threat level": (
        'accept event.alert exists and\n    event.threat_level >= "4"',
        (2, 27),
        "expected a whole number for 'event.threat_level' (int)",
    ),
    "undeclared event attribute": (
        'accept event.x == "y"',
        (1, 8),
        "unknown attribute 'event.x': the declared event attributes are action, alert, kind",
    ),
    "receiver attribute as sender's": (
        "accept sender.load > 0.5",
        (1, 8),
        "unknown attribute 'sender.load': senders' models declare organization, region, scope",
    ),
}


@pytest.mark.parametrize(
    ("text", "position", "reason"), ILL_TYPED_POLICIES.values(), ids=ILL_TYPED_POLICIES
)
def test_an_ill_typed_policy_is_refused_on_save_with_position_and_expected_type(
    scenario, text, position, reason
):
    server = scenario.servers[0]
    with pytest.raises(PolicyRejected) as refused:
        set_policy(client=server, text=text, actor=Actor("user", "olivia"))
    assert (refused.value.field, (refused.value.line, refused.value.column)) == ("policy", position)
    assert reason in refused.value.message
    assert server.policy_versions.count() == 1
    refusal = AuditEntry.objects.using("audit").get(action="policy.set", outcome="refused")
    assert refusal.reason == refused.value.message


ILL_TYPED_SELECTORS = {
    "text for a float": ('load >= "high"', (1, 9), "expected a number for 'load' (float)"),
    "text for a bool": ('cgi == "yes"', (1, 8), "expected true or false for 'cgi' (bool)"),
    "misspelt name": ("lod > 1", (1, 1), "did you mean 'load'?"),
    "sender's attribute": ("trust >= 2", (1, 1), "unknown attribute 'trust': receivers' models"),
    "shorthand on a float": (
        'software == "IIS" and\n  receiver.load',
        (2, 3),
        "'receiver.load' alone means 'receiver.load == true', which needs true or false",
    ),
}


@pytest.mark.parametrize(
    ("selector", "position", "reason"), ILL_TYPED_SELECTORS.values(), ids=ILL_TYPED_SELECTORS
)
def test_an_ill_typed_selector_is_refused_on_publish_with_position_and_expected_type(
    scenario, selector, position, reason
):
    with pytest.raises(PolicyRejected) as refused:
        publish_event(
            sender=scenario.controllers["intellimune-national"],
            content={"kind": "command", "action": "status"},
            selector=selector,
        )
    assert (refused.value.field, (refused.value.line, refused.value.column)) == (
        "selector",
        position,
    )
    assert reason in refused.value.message
    assert not Event.objects.exists()
    assert AuditEntry.objects.using("audit").filter(action="event.publish", outcome="refused")


def test_the_protocol_documents_selector_example_is_published(scenario):
    event = publish_event(
        sender=scenario.controllers["intellimune-national"],
        content={"kind": "command", "action": "disable-cgi"},
        selector='receiver.software == "IIS" and receiver.cgi',
    )
    assert event.selector == 'receiver.software == "IIS" and receiver.cgi'


def test_a_declared_content_attribute_must_have_a_value_of_its_type(scenario):
    with pytest.raises(InvalidInput) as refused:
        publish_event(
            sender=scenario.controllers["northwest-controller"],
            content={"alert": "worm", "threat_level": "4"},
        )
    assert refused.value.field == "content.threat_level"
    assert refused.value.message == (
        'event attribute threat_level (int) must be a whole number, got "4"'
    )
    assert not Event.objects.exists()


def test_undeclared_content_is_published_but_no_policy_can_test_it(scenario):
    event = publish_event(
        sender=scenario.controllers["intellimune-national"],
        content={"kind": "command", "note": "from the night shift"},
    )
    assert event.content["note"] == "from the night shift"
    with pytest.raises(PolicyRejected, match=r"unknown attribute 'event\.note'"):
        set_policy(
            client=scenario.servers[0],
            text="accept event.note exists",
            actor=Actor("user", "olivia"),
        )


def test_a_published_event_reads_back_as_it_was_returned(scenario):
    sender = scenario.controllers["northwest-controller"]
    event = publish_event(
        sender=sender,
        content={"alert": "worm", "note": "ünïcode ✓"},
        selector='receiver.software == "IIS"',
        channel="worm/2026",
        idempotency_key="key-1",
        recipients=[scenario.servers[0].pk],
    )
    stored = Event.objects.get(pk=event.pk)
    fields = [f.attname for f in Event._meta.concrete_fields]
    assert {f: getattr(stored, f) for f in fields} == {f: getattr(event, f) for f in fields}
    assert stored.txid and stored.recipients == [scenario.servers[0].pk]


def test_attested_values_that_expired_or_were_revoked_are_not_the_senders(scenario):
    sender = scenario.controllers["northwest-controller"]
    values = AttributeValue.objects.filter(client=sender)
    values.filter(name="trust").update(expires_at=timezone.now() - timedelta(seconds=1))
    values.filter(name="region").update(revoked_at=timezone.now())
    event = publish_event(sender=sender, content={"alert": "worm"})
    assert event.sender_attributes == {"organization": "Government", "scope": "regional"}


def test_an_event_checked_before_a_declaration_is_checked_again_under_it(scenario):
    sender = scenario.controllers["northwest-controller"]
    publish_event(sender=sender, content={"alert": "worm"})  # the vocabulary is read
    # Declared by another process: this one's vocabulary has not seen it.
    EventAttribute.objects.create(name="severity", type="int")
    with pytest.raises(InvalidInput) as refused:
        publish_event(sender=sender, content={"alert": "worm", "severity": "high"})
    assert refused.value.field == "content.severity"
    assert Event.objects.count() == 1


def test_a_vocabulary_that_keeps_moving_does_not_stop_publishing(scenario, monkeypatch):
    # Declarations that keep coming (models, event attributes) keep moving the stamp.
    words = events.stamped_vocabulary()[1]
    monkeypatch.setattr(
        events, "stamped_vocabulary", lambda **_: ((-1,) * len(events.VOCABULARY_STAMP), words)
    )
    statements = StatementCounter()
    with connection.execute_wrapper(statements):
        event = publish_event(sender=scenario.controllers["northwest-controller"], content={"n": 1})
    assert Event.objects.get().pk == event.pk
    # A savepoint and the statement per attempt; only the last one, unchecked, inserts.
    assert statements.count == 3 * events.VOCABULARY_ATTEMPTS


def test_the_same_policy_stated_again_is_no_new_version(scenario):
    # An agent states its policy at every login: restarts must not pile up versions.
    server = scenario.servers[0]

    again = set_policy(client=server, text=WEB_SERVER_POLICY, actor=Actor("client", server.name))

    assert again.version == 1 and server.policy_versions.count() == 1
