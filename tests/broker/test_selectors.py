"""Reads the HTTP API and the pages share: a page of clients, an event's status. Each
costs a fixed number of queries, however many rows it returns."""

from __future__ import annotations

import pytest
from django.utils import timezone

from broker.models import Client, Delivery, Event
from broker.reads.clients import clients_with_attributes, current_attributes
from broker.reads.events import event_status
from broker.services.events import publish_event
from tests.broker.agent_helpers import ISSUER
from tests.module_data import copy_for_the_test, scenario_for_the_module

pytestmark = pytest.mark.django_db

COMMAND = {"kind": "command", "action": "disable-cgi"}


loaded_scenario = scenario_for_the_module(servers=100)


@pytest.fixture
def scenario(loaded_scenario):
    return copy_for_the_test(loaded_scenario)


def test_a_page_of_a_hundred_clients_with_their_attributes_takes_two_queries(
    scenario, django_assert_num_queries
):
    query = Client.objects.filter(model__name="web-server").order_by("name")
    with django_assert_num_queries(2):
        page = clients_with_attributes(query, offset=0, limit=100)
    assert [row["name"] for row in page] == list(query.values_list("name", flat=True))
    server = Client.objects.get(name=page[0]["name"])
    assert page[0] == {
        "name": server.name,
        "model": "web-server",
        "can_send": server.can_send,
        "can_receive": server.can_receive,
        "is_active": True,
        "attributes": current_attributes(server),
    }
    assert page[0]["attributes"]["region"]  # attested values are read with the rest


def test_a_page_past_the_end_is_empty_and_reads_no_attributes(scenario, django_assert_num_queries):
    with django_assert_num_queries(1):
        assert clients_with_attributes(Client.objects.order_by("name"), offset=500, limit=10) == []


def test_the_status_of_an_event_delivered_to_a_hundred_receivers_takes_one_query(
    scenario, django_assert_num_queries
):
    sender = scenario.controllers["intellimune-national"]
    published = publish_event(sender=sender, content=COMMAND, actor=ISSUER)
    receivers = list(Client.objects.filter(model__name="web-server").order_by("-name"))
    _deliver(published, receivers)
    event = Event.objects.select_related("sender").get(pk=published.pk)
    with django_assert_num_queries(1):
        status = event_status(event)
    assert status["sender"] == sender.name
    assert status["counts"] == {
        "pending": 99, "delivered": 0, "acked": 1, "failed": 0, "expired": 0,
    }  # fmt: skip
    assert [d["receiver"] for d in status["deliveries"]] == sorted(r.name for r in receivers)
    acked = next(d for d in status["deliveries"] if d["state"] == "acked")
    assert acked["result"] == {"done": True} and acked["position"] == 1


def _deliver(event: Event, receivers: list[Client]) -> None:
    """Deliveries as a leaf records them (the tree itself is tested elsewhere); the
    first receiver has acknowledged."""
    now = timezone.now()
    Delivery.objects.bulk_create(
        Delivery(
            event=event, receiver=receiver, sender=event.sender, channel=event.channel,
            sequence=event.sequence, expires_at=event.expires_at, position=1, delivered_at=now,
            state=Delivery.State.ACKED if index == 0 else Delivery.State.PENDING,
            acked_at=now if index == 0 else None, result={"done": True} if index == 0 else None,
        )
        for index, receiver in enumerate(receivers)
    )  # fmt: skip
