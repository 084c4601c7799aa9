"""The worm-response scenario (docs/scenario.md) played out through the real tree: a real
Celery worker, PostgreSQL and Redis."""

import pytest

from broker.audit import Actor
from broker.models import AuditEntry, Client, Delivery, Event
from broker.reads.clients import current_attributes
from broker.services.clients import state_attributes
from broker.services.events import publish_event
from demo.scenario import OVERLOADED, VULNERABLE, WORM_ALERT, load_scenario
from tests.broker.tree_helpers import wait_until_idle
from tests.broker.tree_oracle import matching, receiver_states

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "audit"])


def delivered_to(event: Event) -> set[str]:
    return set(Delivery.objects.filter(event=event).values_list("receiver__name", flat=True))


def oracle(event: Event) -> set[str]:
    """The brute-force answer of tree_oracle, by receiver name."""
    ids = matching(event, receiver_states())
    return set(Client.objects.filter(id__in=ids).values_list("name", flat=True))


@pytest.fixture
def scenario(celery_worker):
    scenario = load_scenario(servers=40)
    wait_until_idle()
    return scenario


def test_the_northwest_alert_reaches_exactly_the_northwest_servers(scenario):
    alert = publish_event(
        sender=scenario.controllers["northwest-controller"],
        content=WORM_ALERT,
        selector='region == "Northwest"',
        lifetime_s=600,
    )
    wait_until_idle()
    northwest = {s.name for s in scenario.servers if current_attributes(s)["region"] == "Northwest"}
    assert len(northwest) == 10
    assert delivered_to(alert) == northwest == oracle(alert)


def test_the_disable_cgi_command_reaches_exactly_the_vulnerable_servers(scenario):
    command = publish_event(
        sender=scenario.controllers["intellimune-national"],
        content={"kind": "command", "action": "disable-cgi"},
        selector=VULNERABLE,
    )
    wait_until_idle()
    expected = oracle(command)
    assert expected  # the scenario has vulnerable servers in every region
    assert delivered_to(command) == expected


def test_servers_crossing_the_load_threshold_get_the_live_shutdown_once(scenario):
    shutdown = publish_event(
        sender=scenario.controllers["intellimune-national"],
        content={"kind": "command", "action": "shutdown"},
        selector=OVERLOADED,
        lifetime_s=600,
    )
    wait_until_idle()
    assert delivered_to(shutdown) == set()
    iis_24 = [s for s in scenario.servers if _is_iis_24(s)][:2]
    apache = next(s for s in scenario.servers if current_attributes(s)["software"] == "Apache")
    for server in [*iis_24, apache]:
        state_attributes(client=server, values={"load": 0.93}, actor=Actor("client", server.name))
    wait_until_idle()
    for server in iis_24:  # a second crossing must not deliver again
        state_attributes(client=server, values={"load": 0.97}, actor=Actor("client", server.name))
    wait_until_idle()
    assert delivered_to(shutdown) == {s.name for s in iis_24}
    assert Delivery.objects.filter(event=shutdown).count() == 2


def test_the_trust_1_controllers_alert_is_refused_by_every_policy_and_audited(scenario):
    alert = publish_event(
        sender=scenario.controllers["rogue-controller"],
        content=WORM_ALERT,
        selector='region == "Northwest"',
    )
    wait_until_idle()
    assert delivered_to(alert) == set()
    refusals = AuditEntry.objects.filter(
        action="event.refused_by_policy", target=f"event:{alert.pk}"
    )
    assert refusals.exists()
    assert all(entry.outcome == "refused" for entry in refusals)
    assert {entry.actor for entry in refusals} == {"client:rogue-controller"}
    assert {entry.details["category"] for entry in refusals} == {"sender_not_qualified"}


def _is_iis_24(server) -> bool:
    attributes = current_attributes(server)
    return attributes["software"] == "IIS" and attributes["version"].startswith("2.4.")


def test_a_connected_receiver_is_pushed_its_delivery_through_the_channel_layer(scenario):
    import asyncio

    from asgiref.sync import async_to_sync
    from channels.layers import get_channel_layer

    from broker.push.to_agents import client_group

    layer = get_channel_layer()
    server = next(s for s in scenario.servers if current_attributes(s)["region"] == "Northwest")

    async def receive_push(publish):
        channel = await layer.new_channel()
        await layer.group_add(client_group(server.id), channel)
        event = await publish()
        return event, await asyncio.wait_for(layer.receive(channel), timeout=20)

    from asgiref.sync import sync_to_async

    publish = sync_to_async(
        lambda: publish_event(
            sender=scenario.controllers["northwest-controller"],
            content=WORM_ALERT,
            selector='region == "Northwest"',
        )
    )
    alert, message = async_to_sync(receive_push)(publish)
    assert message["type"] == "deliveries.push"
    (item,) = message["groups"][client_group(server.id)]
    assert (item["event"], item["sequence"], item["content"]) == (str(alert.pk), 1, WORM_ALERT)
