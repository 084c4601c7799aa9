"""The fleet simulator: real agent processes on real sockets obey the scenario's
commands by changing their attributes and reporting back."""

from __future__ import annotations

import time

import pytest

from broker.models import AttributeValue, Delivery
from broker.reads.clients import current_attributes
from broker.services.events import publish_event
from tests.broker.agent_helpers import wait_for
from tests.demo.fleets import answered, running_fleet

pytestmark = pytest.mark.django_db(transaction=True)

IIS = 'receiver.software == "IIS"'


@pytest.fixture
def fleet(asgi_server, celery_worker):
    """Six scenario web servers running as agents in two processes."""
    yield from running_fleet(asgi_server)


@pytest.fixture
def verifying_fleet(asgi_server, celery_worker):
    """The same, as `./run` starts it: the console holds the demo's signing keys, and
    the agents act only on signed events that agree."""
    yield from running_fleet(asgi_server, signed=True)


def test_the_fleet_disables_cgi_when_told_and_reports_it(fleet):
    command = publish_event(
        sender=fleet.controllers["intellimune-national"],
        content={"kind": "command", "action": "disable-cgi"},
        selector=IIS,
        lifetime_s=120,
    )
    wait_for(lambda: answered(command, 2), "every IIS server answered")
    deliveries = answered(command, 2)
    assert {d.receiver.name for d in deliveries} == {"web-00000", "web-00003"}
    for delivery in deliveries:
        assert delivery.state == "acked"
        assert delivery.result["output"] == f"{delivery.receiver.name}: CGI disabled"
    wait_for(
        lambda: all(current_attributes(d.receiver)["cgi"] is False for d in deliveries),
        "the servers reported CGI off",
    )


def test_a_shut_down_server_reports_it_and_its_load_drops_to_zero(fleet):
    command = publish_event(
        sender=fleet.controllers["intellimune-national"],
        content={"kind": "command", "action": "shutdown"},
        selector='receiver.hostname == "web-00001"',
        lifetime_s=120,
    )
    wait_for(lambda: answered(command, 1), "web-00001 answered")
    (delivery,) = answered(command, 1)
    assert delivery.result == {"exit_code": 0, "output": "web-00001: web server stopped"}
    server = delivery.receiver
    wait_for(lambda: current_attributes(server)["load"] == 0.0, "the load dropped")
    time.sleep(1.5)  # three drift intervals: a stopped server's load stays at zero
    assert current_attributes(server)["load"] == 0.0


def test_running_servers_let_their_load_drift(fleet):
    before = {v.client_id: v.set_at for v in AttributeValue.objects.filter(name="load")}
    wait_for(
        lambda: (
            sum(v.set_at > before[v.client_id] for v in AttributeValue.objects.filter(name="load"))
            >= 3
        ),
        "loads drifted",
    )


def test_the_demos_verifying_fleet_obeys_a_signed_command_and_refuses_an_unsigned_one(
    verifying_fleet,
):
    national = verifying_fleet.controllers["intellimune-national"]
    national.refresh_from_db()  # its signing key was made after it was loaded
    command = {"kind": "command", "action": "disable-cgi"}
    unsigned = publish_event(sender=national, content=command, selector=IIS)
    refused = _answered_eventually(unsigned)
    signed = publish_event(sender=national, content=command, selector=IIS, console_signs=True)
    obeyed = _answered_eventually(signed)

    assert refused and {d.state for d in refused} == {"failed"}
    assert all("not signed by its sender" in d.result["error"] for d in refused)
    assert {d.state for d in obeyed} == {"acked"} and len(obeyed) == len(refused)


def _answered_eventually(event) -> list[Delivery]:
    iis = AttributeValue.objects.filter(name="software", value="IIS").count()
    wait_for(lambda: answered(event, iis), f"the {iis} IIS servers answered")
    return answered(event, iis)


def test_a_repeated_benchmark_notification_is_timed_once_at_its_first_arrival(tmp_path):
    import random

    from sn_agent.client import Notification

    from demo.simulator import SimulatedServer, agent_config

    values = {"hostname": "web-x", "software": "IIS", "version": "2.4", "cgi": True, "load": 0.1}
    config = agent_config(tmp_path, "ws://unused", values)
    server = SimulatedServer(config, values=values, load_interval_s=5.0, rng=random.Random(0))
    first = Notification(7, "e", 1, "ops", 1, {"bench": "alert", "sent_at": time.time()}, 3)
    server.arrived(first)
    server.arrived(Notification(**{**first.__dict__, "replay": True}))
    server.arrived(Notification(**{**first.__dict__, "delivery": 8, "position": 4}))
    assert [(label, delivery) for label, delivery, _ in server.receipts] == [
        ("alert", 7),
        ("alert", 8),
    ]
    assert len(server.latencies_ms) == 2
