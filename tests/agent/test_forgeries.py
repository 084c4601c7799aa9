"""An attacker who can write PostgreSQL and the Redis that carries pushes, but holds no
private key, cannot make an agent that verifies run anything (docs/security.md,
"Signed events"). A real `sn-agent run` with [trust], a real Uvicorn and Celery worker;
the forgeries are written straight into the database and Redis."""

from __future__ import annotations

import getpass
import uuid
from pathlib import Path

import pytest

from broker.models import AgentPresence, Delivery, Event, ReceiverStream
from broker.push.to_agents import push
from broker.services.events import publish_event
from tests.agent.attacker import (
    answered,
    forged_delivery,
    forged_event,
    forged_push,
    redelivered,
    self_signed_seal,
    stopped_after_refusals,
)
from tests.agent.running_agent import SERVER, command, wait_answered
from tests.broker.agent_helpers import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

SENDER = "intellimune-national"


@pytest.fixture
def verifying_agent(agent):
    """web-00000's agent, started: it verifies (tests/agent/conftest.py)."""
    agent.start()
    return agent


def signed_command(web_server, action: str, *, sender=SENDER, to=SERVER) -> Event:
    """A command as an operator's send publishes it: signed by the console."""
    scenario, _ = web_server
    return publish_event(
        sender=scenario.controllers[sender],
        content={"kind": "command", "action": action},
        selector=f'receiver.hostname == "{to}"',
        lifetime_s=300,
        channel="commands",
        console_signs=True,
    )


def refusal_of(event: Event) -> str:
    delivery = wait_answered(event)
    assert delivery.state == "failed", delivery.result
    return delivery.result["error"]


def test_a_signed_command_runs_and_an_unsigned_one_is_refused_without_running(
    verifying_agent, web_server
):
    genuine = signed_command(web_server, "disable-cgi")
    assert wait_answered(genuine).state == "acked"
    scenario, _ = web_server
    unsigned = publish_event(  # what a stolen sender token, or the API unsigned, publishes
        sender=scenario.controllers[SENDER],
        content={"kind": "command", "action": "disable-cgi"},
        selector=f'receiver.hostname == "{SERVER}"',
        channel="commands",
    )

    assert "not acted on: the event is not signed by its sender" in refusal_of(unsigned)
    assert [r["event"] for r in verifying_agent.recorded()] == [str(genuine.pk)]


def test_forged_events_and_deliveries_written_in_postgresql_run_nothing(
    verifying_agent, web_server
):
    genuine = signed_command(web_server, "disable-cgi")
    wait_answered(genuine)
    verifying_agent.stop()
    # Written straight into the tables, as whoever holds the database's password would:
    changed = forged_event(genuine, content={"kind": "command", "action": "slow"})
    own_id = uuid.uuid4()
    own_key = forged_event(genuine, id=own_id, seal=self_signed_seal(genuine, own_id))
    deliveries = [forged_delivery(changed), forged_delivery(own_key), redelivered(genuine)]
    verifying_agent.start()  # its login replays what it has not seen

    wait_for(lambda: all(answered(d) for d in deliveries), "every forgery was answered")
    errors = [Delivery.objects.get(pk=d.pk).result["error"] for d in deliveries]
    assert "signature of intellimune-national does not hold" in errors[0]
    assert "no authority this agent trusts attests intellimune-national" in errors[1]
    assert f"event {genuine.pk} was handed over before" in errors[2]
    assert [r["event"] for r in verifying_agent.recorded()] == [str(genuine.pk)]


def test_forged_pushes_through_redis_run_nothing(verifying_agent, web_server):
    genuine = signed_command(web_server, "disable-cgi")
    wait_answered(genuine)
    position = ReceiverStream.objects.get(client__name=SERVER).last_position
    receiver = Delivery.objects.get(event=genuine).receiver_id
    seal = Event.objects.get(pk=genuine.pk).seal
    # Pushes written to Redis, with no row behind them, each with a seal of its own.
    push([
        forged_push(genuine, receiver, position + 1, {"action": "slow"}, seal, new_id=True),
        forged_push(genuine, receiver, position + 2, genuine.content, None, new_id=True),
        forged_push(genuine, receiver, position + 3, genuine.content, seal),
    ])  # fmt: skip

    output = stopped_after_refusals(verifying_agent, 3)
    assert "does not hold" in output and "not signed by its sender" in output
    assert "was handed over before" in output
    assert [r["event"] for r in verifying_agent.recorded()] == [str(genuine.pk)]


def test_a_genuine_event_delivered_where_its_sender_or_the_policy_did_not_agree_runs_nothing(
    verifying_agent, web_server
):
    # Genuine, signed events: one addressed to the other server, one from a sender this
    # server's policy does not accept commands from. The console delivers neither here;
    # whoever writes its database does.
    elsewhere = signed_command(web_server, "disable-cgi", to="web-00001")
    refused_sender = signed_command(web_server, "disable-cgi", sender="northwest-controller")
    wait_for(lambda: Event.objects.filter(routed_at__isnull=False).count() >= 2, "routed")
    verifying_agent.stop()
    deliveries = [forged_delivery(elsewhere), forged_delivery(refused_sender)]
    verifying_agent.start()

    wait_for(lambda: all(answered(d) for d in deliveries), "both were answered")
    errors = [Delivery.objects.get(pk=d.pk).result["error"] for d in deliveries]
    assert 'its selector does not select this server: receiver.hostname == "web-00001"' in errors[0]
    assert "this server's policy does not accept it from northwest-controller" in errors[1]
    assert verifying_agent.recorded() == []


# An agent installed as docs/agent.md's smallest configuration: no [trust] --------------


def smallest_configuration(agent) -> str:
    """docs/agent.md's smallest configuration, pointed at this test's console, token,
    folder and recording action."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "agent.md").read_text()
    section = doc.split("## The smallest configuration", 1)[1]
    text = section.split("```toml\n", 1)[1].split("```", 1)[0]
    recording = agent.config.read_text().split("[actions.disable-cgi]", 1)[1].split("\n\n")[0]
    return (
        text.replace("wss://console.example.com/ws/agent/v1/", agent.url)
        .replace("/etc/sn-agent/token", "token")
        .replace("/var/lib/sn-agent", "state")
        .replace("[actions.status]", f'action_user = "{getpass.getuser()}"\n[actions.disable-cgi]')
        .replace('command = ["/usr/local/bin/web-status", "--json"]', recording.strip())
    )


def test_an_agent_as_the_docs_smallest_configuration_runs_nothing_signed_or_not(agent, web_server):
    agent.config.write_text(smallest_configuration(agent))
    agent.start()
    unsigned = command(web_server, "disable-cgi", signed=False)
    genuine = command(web_server, "disable-cgi")
    wait_answered(genuine)
    agent.stop()
    altered = forged_event(genuine, content={"kind": "command", "action": "disable-cgi", "x": 1})
    deliveries = [forged_delivery(altered)]
    agent.start()
    scenario, _ = web_server
    alert = publish_event(
        sender=scenario.controllers["northwest-controller"],
        content={"kind": "alert", "alert": "worm", "threat_level": 4},
        selector=f'receiver.hostname == "{SERVER}"',
        console_signs=True,
    )

    wait_for(lambda: all(answered(d) for d in deliveries), "the altered one was answered")
    for event in (unsigned, genuine, altered):
        assert "not acted on: this agent has no [trust]" in refusal_of(event)
    wait_for(lambda: delivery_state(alert) == "delivered", "the alert was noted")
    assert agent.recorded() == []
    output = agent.stop()
    assert '"acts_on": "nothing"' in output and '"event": "refused"' in output
    assert AgentPresence.objects.get(client__name=SERVER).acts_on == "nothing"


def delivery_state(event) -> str | None:
    delivery = Delivery.objects.filter(event=event).first()
    return delivery and delivery.state
