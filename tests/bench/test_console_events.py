"""The console bench's events (bench/console_events.py): recorded as the leaves record
deliveries, so that the pages it measures read a consistent event."""

from collections import Counter

import pytest
from django.db.models import Max

from bench.console_events import (
    FAILED_RESULT,
    command_event,
    progress_event,
    region_members,
    state_by_share,
)
from broker.models import Delivery, ReceiverStream
from broker.reads.progress import event_progress
from tests.module_data import copy_for_the_test, scenario_for_the_module

pytestmark = pytest.mark.django_db(databases=["default", "audit"])
State = Delivery.State


loaded_scenario = scenario_for_the_module(servers=40)


@pytest.fixture
def scenario(loaded_scenario):
    return copy_for_the_test(loaded_scenario)


def test_the_alert_has_one_delivery_per_northwest_server_in_the_shares_states(scenario):
    event = progress_event()

    northwest = region_members("Northwest")
    deliveries = Delivery.objects.filter(event=event)
    assert sorted(deliveries.values_list("receiver_id", flat=True)) == northwest
    states = Counter(deliveries.values_list("state", flat=True))
    assert states == Counter(state_by_share(receiver) for receiver in northwest)
    assert event_progress(event).total.targeted == len(northwest)


def test_answers_carry_their_times_and_failures_their_results(scenario):
    event = progress_event()

    for delivery in Delivery.objects.filter(event=event):
        answered = delivery.state in (State.ACKED, State.FAILED)
        received = answered or delivery.state == State.DELIVERED
        assert (delivery.acked_at is not None) == answered
        assert (delivery.received_at is not None) == received
        assert (delivery.result == FAILED_RESULT) == (delivery.state == State.FAILED)


def test_the_alert_is_found_again_rather_than_sent_twice(scenario):
    first = progress_event()
    states = dict(Delivery.objects.filter(event=first).values_list("pk", "state"))

    again = progress_event()

    assert again.pk == first.pk
    assert dict(Delivery.objects.filter(event=again).values_list("pk", "state")) == states


def test_each_receiver_gets_its_next_position_without_gaps(scenario):
    receivers = region_members("Southeast")[:5]
    progress_event()
    command_event(receivers)
    command_event(receivers)

    held = Delivery.objects.filter(receiver_id__in=receivers).values_list("receiver_id")
    for receiver, last in held.annotate(last=Max("position")):
        positions = Delivery.objects.filter(receiver_id=receiver).values_list("position", flat=True)
        assert sorted(positions) == list(range(1, last + 1))
        assert ReceiverStream.objects.get(client_id=receiver).last_position == last


def test_the_command_is_received_by_exactly_its_receivers_and_unanswered(scenario):
    receivers = region_members("Southeast")[:5]

    event = command_event(receivers)

    assert event.recipients == sorted(receivers)
    deliveries = Delivery.objects.filter(event=event)
    assert sorted(deliveries.values_list("receiver_id", flat=True)) == sorted(receivers)
    assert set(deliveries.values_list("state", flat=True)) == {State.DELIVERED}
