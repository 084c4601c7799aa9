"""The event page: an event landing server by server, counted from the deliveries
table, announced live, and resent to exactly those that did not answer."""

import asyncio

import pytest
from channels.layers import get_channel_layer
from django.contrib.auth.models import Group
from django.urls import reverse

from broker.audit import Actor
from broker.models import AuditEntry, Delivery, Event
from broker.push.to_consoles import console_group, event_topic
from broker.roles import OPERATOR
from broker.services.deliveries import acknowledge_delivery
from broker.services.sending import Draft, grant_sending, send_as
from demo.scenario import VULNERABLE, load_scenario
from tests.broker.tree_helpers import wait_until_idle
from tests.cast import OPERATOR as OLIVIA
from tests.cast import create_member, log_in_proved

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "audit"])
DISABLE_CGI = {"kind": "command", "action": "disable-cgi"}


@pytest.fixture
def scenario(celery_worker):
    scenario = load_scenario(servers=40)
    operators = Group.objects.get(name=OPERATOR.name)
    national = scenario.controllers["intellimune-national"]
    grant_sending(client=national, holder=operators, actor=Actor("test", "t"))
    wait_until_idle()
    return scenario


@pytest.fixture
def olivia(client):
    user = create_member(OLIVIA)
    log_in_proved(client, user)
    return user


def disable_cgi(user, scenario) -> Event:
    draft = Draft(
        sender=scenario.controllers["intellimune-national"],
        content=DISABLE_CGI,
        selector=VULNERABLE,
        lifetime_s=300,
    )
    event = send_as(user=user, draft=draft, confirmed_count=None, code_is_fresh=True)
    wait_until_idle()
    return event


def answer(delivery: Delivery, status: str, result: dict | None = None) -> None:
    acknowledge_delivery(
        client=delivery.receiver,
        delivery_id=delivery.pk,
        status=status,
        result=result,
        actor=Actor("client", delivery.receiver.name),
    )


def test_the_page_counts_each_state_from_the_deliveries_table(client, olivia, scenario):
    event = disable_cgi(olivia, scenario)
    deliveries = list(Delivery.objects.filter(event=event).select_related("receiver"))
    assert len(deliveries) >= 3
    answer(deliveries[0], "ok", {"exit_code": 0})
    answer(deliveries[1], "failed", {"exit_code": 2, "output": "cgi stuck"})

    body = client.get(reverse("event", args=[event.pk])).content.decode()

    targeted = len(deliveries)
    assert f'data-targeted="{targeted}"' in body
    assert 'data-acked="1"' in body and 'data-failed="1"' in body
    assert f'data-waiting="{targeted - 2}"' in body
    assert f'data-failed="{deliveries[1].receiver.name}"' in body and "cgi stuck" in body
    assert 'data-tally="Northwest"' in body and f'data-live-topic="event.{event.pk}"' in body


def test_resending_reaches_exactly_the_receivers_that_did_not_answer(client, olivia, scenario):
    event = disable_cgi(olivia, scenario)
    deliveries = list(Delivery.objects.filter(event=event).select_related("receiver"))
    answer(deliveries[0], "ok")
    waiting = {d.receiver.name for d in deliveries[1:]}

    response = client.post(reverse("event-resend", args=[event.pk]))
    again = Event.objects.get(resend_of=event)
    wait_until_idle()

    assert response.status_code == 302
    assert set(again.deliveries.values_list("receiver__name", flat=True)) == waiting
    assert again.sent_by == "user:olivia" and sorted(again.recipients) == sorted(
        d.receiver_id for d in deliveries[1:]
    )
    page = client.get(reverse("event", args=[again.pk])).content.decode()
    assert "data-resend-of" in page
    # Receivers the resend does not address did not refuse it.
    refusals = AuditEntry.objects.filter(
        action="event.refused_by_policy", target=f"event:{again.pk}"
    )
    assert not refusals.exists()


def test_an_answer_is_announced_on_the_events_topic_at_once(olivia, scenario):
    event = disable_cgi(olivia, scenario)
    delivery = Delivery.objects.filter(event=event).select_related("receiver").first()
    layer = get_channel_layer()
    channel = asyncio.run(_listen(layer, event))

    answer(delivery, "ok")

    message = asyncio.run(asyncio.wait_for(layer.receive(channel), timeout=2))
    announced = [payload["topic"] for payload in message["groups"].values()]
    assert event_topic(event.pk) in announced


async def _listen(layer, event) -> str:
    channel = await layer.new_channel()
    await layer.group_add(console_group(event_topic(event.pk)), channel)
    return channel


def test_the_list_shows_each_event_with_its_counts(client, olivia, scenario):
    event = disable_cgi(olivia, scenario)

    body = client.get(reverse("events")).content.decode()

    assert f'data-event="{event.pk}"' in body and "user:olivia" in body
