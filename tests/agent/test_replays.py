"""A genuine, signed command runs once at an agent, however it is delivered again while
it lives: after junk written into the database pushed it out of the deliveries the
journal keeps, after the agent's state folder was wiped (docs/security.md, "Replays").
A real `sn-agent run` that verifies, a real Uvicorn and Celery worker; the replays are
written straight into the database, as whoever holds its password would."""

from __future__ import annotations

import shutil
import time

import pytest
from sn_agent.journal import Journal

from broker.models import Delivery
from broker.services.events import publish_event
from tests.agent.attacker import answered, junk_deliveries, redelivered
from tests.agent.running_agent import SERVER, command, load_of_server, wait_answered
from tests.broker.agent_helpers import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_command_pushed_out_of_the_journal_by_1010_junk_deliveries_is_not_run_again(
    agent, web_server
):
    # As the attack was found: an agent that had handled 190 deliveries, a genuine
    # command, then 1,010 junk deliveries written into the database. The journal keeps
    # the newest 1,000 answered deliveries: the genuine one is pruned from them.
    agent.start()
    first = command(web_server, "noop")
    wait_answered(first)
    wait_for_answers(junk_deliveries(first, 189))
    genuine = command(web_server, "disable-cgi")
    assert wait_answered(genuine).state == "acked"
    wait_for_answers(junk_deliveries(genuine, 1010))
    position = Delivery.objects.get(event=genuine).position
    assert position not in kept_positions(agent)  # pushed out of the kept deliveries

    again = redelivered(genuine)
    wait_for(lambda: answered(again), "the replay was answered")

    error = Delivery.objects.get(pk=again.pk).result["error"]
    assert f"event {genuine.pk} was handed over before, at position {position}" in error
    assert [r["event"] for r in agent.recorded()] == [str(genuine.pk)]


def wait_for_answers(deliveries) -> None:
    wait_for(lambda: answered(deliveries[-1]), f"{len(deliveries)} junk answered", 180)


def kept_positions(agent) -> set[int]:
    journal = Journal(agent.folder / "state", read_only=True)
    try:
        return {entry.position for entry in journal.latest(5000)}
    finally:
        journal.db.close()


def test_a_command_replayed_after_the_agents_state_folder_was_wiped_is_not_run_again(
    agent, web_server
):
    agent.start()
    genuine = command(web_server, "disable-cgi")
    assert wait_answered(genuine).state == "acked"
    agent.stop()
    shutil.rmtree(agent.folder / "state")  # a reinstall, or a wiped disk
    time.sleep(1.1)  # signing times are whole seconds: one signed in the same second counts
    agent.start()

    again = redelivered(genuine)
    wait_for(lambda: answered(again), "the replay was answered")

    error = Delivery.objects.get(pk=again.pk).result["error"]
    assert "before this agent's journal began" in error
    assert "this server may have matched it then" in error
    assert [r["event"] for r in agent.recorded()] == [str(genuine.pk)]


def test_a_standing_command_signed_before_a_new_journal_reaches_a_server_that_comes_to_match(
    agent, web_server
):
    scenario, _ = web_server
    standing = publish_event(
        sender=scenario.controllers["intellimune-national"],
        content={"kind": "command", "action": "disable-cgi"},
        selector=f'receiver.hostname == "{SERVER}" and receiver.load > 0.8',
        lifetime_s=600,
        channel="commands",
        console_signs=True,
    )
    time.sleep(1.1)  # signing times are whole seconds
    agent.start()  # a journal begun after the command was signed, the load at 0.31
    wait_for(lambda: load_of_server() == 0.31, "the load was stated")

    agent.load.write_text("0.93\n")  # the server comes to match it

    assert wait_answered(standing).state == "acked"
    assert [r["event"] for r in agent.recorded()] == [str(standing.pk)]
