"""`sn-agent run`, as a managed server runs it: a process of its own with a
configuration file, against a real Uvicorn and a real Celery worker. Its actions are
real commands; it is killed and started again as a real one would be."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from broker.models import AttributeValue, Delivery
from tests.agent.running_agent import (
    SERVER,
    answer_of,
    command,
    load_of_server,
    wait_answered,
)
from tests.broker.agent_helpers import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_configured_action_gets_the_notification_on_stdin_and_its_outcome_is_the_answer(
    agent, web_server
):
    agent.start()
    wait_for(lambda: load_of_server() == 0.31, "the measured load was stated")
    event = command(web_server, "disable-cgi")

    delivery = wait_answered(event)

    [record] = agent.recorded()
    assert record["event"] == str(event.pk) and record["content"]["action"] == "disable-cgi"
    assert record["home"] is None  # only what `env` lists reaches the action
    assert delivery.state == "acked" and delivery.result["exit_code"] == 0
    assert delivery.result["output"] == f"recorded {event.pk}\n"


def test_an_unknown_action_and_a_timed_out_one_answer_failed_saying_why(agent, web_server):
    agent.start()
    unknown, slow = command(web_server, "reboot; rm -rf /"), command(web_server, "sleep")

    assert wait_answered(unknown).result["error"] == "no such action here"
    timed_out = wait_answered(slow)
    assert timed_out.state == "failed" and "timed out after 1 s" in timed_out.result["error"]


def test_a_changed_measurement_is_stated_again(agent, web_server):
    agent.start()
    wait_for(lambda: load_of_server() == 0.31, "the first load was stated")
    agent.load.write_text("0.87 0.5 0.4 1/200 999\n")
    wait_for(lambda: load_of_server() == 0.87, "the new load was stated", 10)


def test_an_agent_killed_and_started_again_runs_nothing_twice_and_misses_nothing(agent, web_server):
    agent.start()
    first = command(web_server, "disable-cgi")
    wait_answered(first)
    agent.stop(signal.SIGKILL)
    second = command(web_server, "disable-cgi")  # while the agent is down
    agent.start()

    wait_answered(second)
    assert [r["event"] for r in agent.recorded()] == [str(first.pk), str(second.pk)]


def test_an_action_running_when_the_agent_was_killed_is_waited_for_and_its_outcome_sent(
    agent, web_server
):
    agent.start()
    event = command(web_server, "slow")
    agent.wait_until_an_action_runs()
    agent.stop(signal.SIGKILL)  # the action goes on, in its own process group
    agent.start()

    delivery = wait_answered(event)
    assert delivery.state == "acked" and delivery.result["output"] == "finished\n"


def test_an_action_killed_with_the_agent_is_answered_failed_not_run_again(agent, web_server):
    agent.start()
    event = command(web_server, "slow")
    group = agent.wait_until_an_action_runs()
    agent.stop(signal.SIGKILL)
    os.killpg(group, signal.SIGKILL)  # as a reboot, or a service manager killing all
    agent.start()

    delivery = wait_answered(event)
    assert delivery.state == "failed" and "stopped while the action ran" in delivery.result["error"]


def test_sigterm_lets_the_running_action_finish_then_exits(agent, web_server):
    agent.start()
    event = command(web_server, "sleep")
    running = agent.folder / "state" / "running"
    wait_for(lambda: any(running.glob("*.mark")), "the action started")
    out = agent.stop(signal.SIGTERM)
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    events = [line["event"] for line in lines]
    assert events.index("stopping") < events.index("answered") < events.index("stopped")
    assert answer_of(event).result["error"].startswith("timed out")


def test_status_says_connected_the_position_and_the_last_deliveries(agent, web_server):
    agent.start()
    event = command(web_server, "disable-cgi")
    wait_answered(event)
    status = subprocess.run(
        [sys.executable, "-m", "sn_agent", "status", "--config", str(agent.config), "--json"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    report = json.loads(status.stdout)
    assert status.returncode == 0 and report["running"] and report["connected"]
    assert report["acts_on"] == "signed"
    [last] = report["deliveries"]
    assert (last["event"], last["status"], last["answered"]) == (str(event.pk), "ok", True)
    agent.stop()
    stopped = subprocess.run(
        [sys.executable, "-m", "sn_agent", "status", "--config", str(agent.config)],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert stopped.returncode == 3 and "not running" in stopped.stdout


def test_sighup_reloads_the_configuration_and_a_broken_one_is_refused(agent, web_server):
    agent.start()
    wait_for(lambda: load_of_server() == 0.31, "the agent stated its model")
    agent.config.write_text(
        agent.config.read_text().replace('software = "IIS"', 'software = "Apache"')
    )
    agent.process.send_signal(signal.SIGHUP)
    wait_for(lambda: software_of_server() == "Apache", "the reloaded model was stated", 10)
    agent.config.write_text("url = 'nowhere'\n")
    agent.process.send_signal(signal.SIGHUP)
    time.sleep(0.5)
    out = agent.stop()
    assert '"event": "reload_refused"' in out and "url: expected" in out


def software_of_server() -> str | None:
    value = AttributeValue.objects.filter(client__name=SERVER, name="software").first()
    return value.value if value else None


def test_an_agent_answering_hundreds_of_commands_at_once_keeps_to_the_rate_and_loses_none(
    agent, web_server
):
    # Each answer is a frame: faster than the console's 50 a second, beyond its burst of
    # 200, the answers over the limit were refused and stayed unrecorded until the next
    # login. Published while the agent is down, they all come in one replay.
    agent.start()
    agent.stop()
    events = [command(web_server, "noop") for _ in range(400)]
    agent.start()

    wait_for(lambda: answered_count(events) == 400, "every command was answered", 120)
    output = agent.stop()
    assert "rate_limited" not in output and "answer_refused" not in output


def answered_count(events) -> int:
    return Delivery.objects.filter(event__in=events, state="acked").count()
