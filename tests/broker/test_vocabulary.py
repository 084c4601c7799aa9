"""The vocabulary: one type per name, by role, read again when it grows, and the texts
parsed with it."""

import logging

import pytest
from django.db import connections

from broker.audit import Actor
from broker.errors import InvalidInput
from broker.models import Client
from broker.services.clients import AttributeSpec, create_client_model, register_client
from broker.services.event_attributes import EventAttributeSpec, declare_event_attributes
from broker.services.events import publish_event
from broker.vocabulary import (
    Vocabulary,
    refused_only_if_current,
    stamped_vocabulary,
    vocabulary,
    vocabulary_at,
)
from demo.scenario import WORM_ALERT, bulk_add_web_servers, load_scenario
from policies import AttributeType, PolicyTypeError, Version

pytestmark = pytest.mark.django_db(databases=["default", "audit"])
SETUP = Actor("system", "test")


@pytest.fixture
def scenario():
    return load_scenario(servers=2)


def test_selectors_are_typed_by_receivers_models_and_policies_by_senders_and_events(scenario):
    words = vocabulary()
    assert words.receiver["version"] is AttributeType.VERSION
    assert "trust" not in words.receiver  # only controllers, which never receive, have it
    assert words.sender == {
        "organization": AttributeType.STRING,
        "scope": AttributeType.STRING,
        "region": AttributeType.STRING,
        "trust": AttributeType.INT,
    }
    assert words.event["threat_level"] is AttributeType.INT
    assert words.event["version"] is AttributeType.STRING  # the alert carries a glob


def test_a_model_counts_for_a_role_once_a_client_of_it_has_that_role(scenario):
    probe = create_client_model(
        name="probe", attributes=[AttributeSpec("latency_ms", "int")], actor=SETUP
    )
    assert "latency_ms" not in vocabulary().receiver
    register_client(name="probe-1", model=probe, can_send=False, can_receive=True, actor=SETUP)
    assert vocabulary().receiver["latency_ms"] is AttributeType.INT
    assert "latency_ms" not in vocabulary().sender


def test_a_new_event_attribute_is_seen_at_the_next_read(scenario):
    before = vocabulary()
    declare_event_attributes(attributes=[EventAttributeSpec("urgent", "bool")], actor=SETUP)
    after = vocabulary()
    assert after is not before and after.event["urgent"] is AttributeType.BOOL
    assert after.policy("accept event.urgent").accepts({}, {"urgent": True})


def test_the_same_content_keeps_the_same_vocabulary_and_its_parsed_texts(scenario):
    words = vocabulary()
    selector = words.selector('version >= "2.4"')
    register_client(
        name="web-extra", model=scenario.web_server_model, can_send=False, can_receive=True,
        actor=SETUP,
    )  # fmt: skip
    assert vocabulary() is words and words.selector('version >= "2.4"') is selector


def test_a_vocabulary_at_the_stamp_it_was_read_at_asks_nothing_and_a_moved_stamp_reads_it_again(
    scenario, django_assert_num_queries
):
    stamp, words = stamped_vocabulary()
    with django_assert_num_queries(0):
        assert vocabulary_at(stamp) is words
    declare_event_attributes(attributes=[EventAttributeSpec("urgent", "bool")], actor=SETUP)
    moved, _ = stamped_vocabulary()
    assert moved != stamp
    assert vocabulary_at(moved).event["urgent"] is AttributeType.BOOL


def test_version_literals_are_versions_wherever_the_vocabulary_parses(scenario):
    constraint = vocabulary().selector('version >= "2.4"').filters()[0].sorted_constraints()[0]
    assert constraint.value == Version("2.4")


def test_a_stored_text_that_no_longer_type_checks_is_logged_and_matches_nothing(caplog):
    words = Vocabulary(receiver={"load": "float"}, sender={}, event={"level": "int"})
    with caplog.at_level(logging.ERROR, logger="broker.vocabulary"):
        policy = words.stored_policy("accept event.severity >= 4")
        selector = words.stored_selector("cgi == true")
    assert not policy.accepts({}, {"severity": 5})
    assert not selector.selects({"cgi": True})
    assert len(caplog.records) == 2
    with pytest.raises(PolicyTypeError):
        words.policy("accept event.severity >= 4")


def test_a_process_that_read_the_vocabulary_before_a_bulk_load_publishes_to_what_it_loaded():
    # A fresh database: the web servers' model is declared, but no client receives yet,
    # so this process's vocabulary has no receiver attribute at all.
    load_scenario(servers=0)
    assert vocabulary().receiver == {}
    bulk_add_web_servers(4)  # COPY, behind the services' back
    event = publish_event(
        sender=Client.objects.get(name="northwest-controller"),
        content=WORM_ALERT,
        selector='region == "Northwest"',
    )
    assert event.selector == 'region == "Northwest"'


def test_a_refusal_under_the_current_vocabulary_stands_without_a_second_check(scenario):
    stamp, words = stamped_vocabulary()
    checked = []

    def refuse(words):
        checked.append(words)
        raise InvalidInput("no")

    with pytest.raises(InvalidInput):
        refused_only_if_current(refuse, stamp, words)
    assert checked == [words]


def test_a_refusal_under_a_vocabulary_that_moved_is_checked_again_under_the_new_one(scenario):
    stamp, words = stamped_vocabulary()
    declare_event_attributes(attributes=[EventAttributeSpec("urgent", "bool")], actor=SETUP)
    policy, _, current = refused_only_if_current(
        lambda w: w.policy("accept event.urgent"), stamp, words
    )
    assert current is not words and policy.accepts({}, {"urgent": True})


@pytest.mark.django_db(transaction=True, databases=["default", "audit"])
def test_a_model_counts_once_its_first_receiver_commits_whatever_the_order_of_commits():
    # Another writer takes a client id before this process's next client and commits
    # after it: the largest id does not move when it commits, the models in use do.
    controller = load_scenario(servers=0).controller_model
    probe = create_client_model(
        name="probe", attributes=[AttributeSpec("latency_ms", "int")], actor=SETUP
    )
    other = connections.create_connection("default")
    try:
        with other.cursor() as cursor:
            other.set_autocommit(False)
            cursor.execute(INSERT_CLIENT, ["probe-1", probe.pk])
            assert "latency_ms" not in vocabulary().receiver
            register_client(
                name="later-1", model=controller, can_send=True, can_receive=False, actor=SETUP
            )  # committed with a larger id than probe-1's
            assert "latency_ms" not in vocabulary().receiver
            other.commit()
    finally:
        other.close()
    assert vocabulary().receiver["latency_ms"] is AttributeType.INT


INSERT_CLIENT = """
INSERT INTO broker_client (name, model_id, can_send, can_receive, secret_hash, is_active,
                           created_at)
VALUES (%s, %s, false, true, '-', true, now())
"""
