"""Why a server did or did not get an event, explained from the worm scenario played
through the real tree (Celery worker, PostgreSQL, Redis): each check clause by clause
on the values as they were, and the hops the event took."""

import pytest

from broker.audit import Actor
from broker.models import Client, Event
from broker.reads.why import why
from broker.services.authorities import attest_attributes
from broker.services.clients import state_attributes
from broker.services.events import publish_event
from demo.scenario import WORM_ALERT, load_scenario
from tests.broker.tree_helpers import wait_until_idle

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "audit"])

NORTHWEST = 'region == "Northwest"'
NORTHWEST_SERVER = "web-00004"  # servers take the regions in turn: 0 and 4 are Northwest
SOUTHEAST_SERVER = "web-00003"


@pytest.fixture
def scenario(celery_worker):
    scenario = load_scenario(servers=12)
    wait_until_idle()
    return scenario


def publish(scenario, sender: str, content: dict, selector: str = "", **options) -> Event:
    event = publish_event(
        sender=scenario.controllers[sender], content=content, selector=selector, **options
    )
    wait_until_idle()
    return Event.objects.select_related("sender").get(pk=event.pk)


def client(name: str) -> Client:
    return Client.objects.get(name=name)


def move(scenario, server: Client, region: str) -> None:
    grant = scenario.grants[(server.name, scenario.inventory.name)]
    attest_attributes(
        authority=scenario.inventory, client=server, grant_key=grant, values={"region": region}
    )
    wait_until_idle()


def test_a_northwest_server_got_the_alert_through_the_hops_from_its_senders_leaf(scenario):
    alert = publish(scenario, "northwest-controller", WORM_ALERT, NORTHWEST)
    server = client(NORTHWEST_SERVER)
    found = why(alert, server)
    assert found.delivered and found.summary.startswith(f"{NORTHWEST_SERVER} got it: delivered")
    (branch,) = found.selector.check.branches
    (row,) = branch.rows
    assert (row.check.holds, row.part, row.check.value) == (True, "receiver", "Northwest")
    assert row.provenance.authority == "macrocorp-inventory"
    assert found.selector.moment == found.delivery.delivered_at
    assert found.policy.holds and not found.came_later
    hops = found.route.hops
    assert hops[0].dispatcher == alert.sender.dispatcher.name and hops[0].direction == "up"
    assert hops[-1].dispatcher == server.dispatcher.name and hops[-1].delivered >= 1
    assert found.route.reached_leaf and all(hop.toward_receiver for hop in hops)
    assert [hop.at for hop in hops] == sorted(hop.at for hop in hops)


def test_a_southeast_server_is_explained_by_the_region_it_had_then_not_now(scenario):
    alert = publish(scenario, "northwest-controller", WORM_ALERT, NORTHWEST)
    server = client(SOUTHEAST_SERVER)
    move(scenario, server, "Southwest")
    found = why(alert, server)
    assert not found.delivered
    assert found.summary == (
        f"{SOUTHEAST_SERVER} did not get it: the selector did not select it: "
        'region == "Northwest" (region is "Southeast")'
    )
    assert found.selector.moment == alert.published_at
    (row,) = found.selector.check.branches[0].rows
    assert row.provenance.value == "Southeast" and row.provenance.set_at < alert.published_at
    assert not found.selector.now.holds  # today it is in the Southwest: still not selected
    assert "Southwest" in found.selector.now.failing_text


def test_the_rogue_controllers_alert_is_refused_on_its_trust_attested_by_the_trust_manager(
    scenario,
):
    alert = publish(scenario, "rogue-controller", WORM_ALERT, NORTHWEST)
    found = why(alert, client(NORTHWEST_SERVER))
    assert found.summary == (
        f"{NORTHWEST_SERVER} did not get it: its policy refused the sender: "
        "sender.trust >= 2 (sender.trust is 1)"
    )
    assert found.selector.check.holds and not found.policy.holds
    trust = next(a for a in found.policy.sender_attributes if a.name == "trust")
    assert (trust.value, trust.provenance.authority) == (1, "trust-manager")
    assert trust.provenance.set_at <= alert.published_at and trust.provenance.expires_at is None
    parts = {row.check.attribute: row.part for b in found.policy.check.branches for row in b.rows}
    assert parts["sender.trust"] == "sender" and parts["event.threat_level"] == "content"
    trust_row = next(r for r in found.policy.check.nearest.rows if r.check.name == "trust")
    assert trust_row.provenance == trust.provenance


def test_a_content_clause_that_fails_is_named_as_the_content(scenario):
    notice = {"kind": "notice", "action": "status"}
    event = publish(scenario, "intellimune-national", notice, NORTHWEST)
    found = why(event, client(NORTHWEST_SERVER))
    assert found.summary == (
        f"{NORTHWEST_SERVER} did not get it: its policy refused the content: "
        'event.kind == "command" (event.kind is "notice")'
    )
    (failing,) = found.policy.check.nearest.failing
    assert failing.part == "content" and failing.provenance is None


def test_a_server_that_came_to_match_a_standing_command_later_is_explained_then(scenario):
    overloaded = 'software == "IIS" and version ~ "2.4.*" and load >= 0.8'
    command = {"kind": "command", "action": "shutdown"}
    shutdown = publish(scenario, "intellimune-national", command, overloaded, lifetime_s=600)
    server = client("web-00000")  # IIS 2.4.1
    state_attributes(client=server, values={"load": 0.93}, actor=Actor("client", server.name))
    wait_until_idle()
    found = why(shutdown, server)
    assert found.delivered and found.came_later
    assert "it came to match after the event was published" in found.summary
    load = next(r for r in found.selector.check.branches[0].rows if r.check.name == "load")
    assert (load.check.holds, load.check.value, load.provenance.source) == (True, 0.93, "client")


def test_a_sender_is_not_a_receiver_and_an_event_without_selector_selects_everyone(scenario):
    command = {"kind": "command", "action": "status"}
    event = publish(scenario, "intellimune-national", command)
    found = why(event, client("northwest-controller"))
    assert (
        found.summary == "northwest-controller did not get it: it is not a receiver (it only sends)"
    )
    assert found.policy is None and found.selector.text == ""
    assert found.selector.check.holds
    everyone = why(event, client(SOUTHEAST_SERVER))
    assert everyone.delivered and everyone.selector.check.holds
