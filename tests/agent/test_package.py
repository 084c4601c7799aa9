"""The agent as a managed server gets it: a wheel built from agent/, installed into a
virtual environment of its own that has no Django, working against the real service."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from broker.models import Delivery
from tests.agent.running_agent import SERVER, command, verifying_agent, wait_answered

AGENT = Path(__file__).resolve().parents[2] / "agent"


def test_the_agent_code_runs_on_python_3_9():
    done = subprocess.run(
        [str(Path(sys.executable).parent / "vermin"), "-t=3.9-", "--no-tips", "--violations",
         "--eval-annotations", str(AGENT / "src")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A fresh virtual environment with the agent's wheel (and only what it needs)."""
    folder = tmp_path_factory.mktemp("wheel")
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", folder, AGENT])
    [wheel] = folder.glob("sn_agent-*.whl")
    env = folder / "venv"
    venv.create(env, with_pip=True)
    # The same websockets the server uses, from this machine's cache when it has it.
    run([env / "bin" / "python", "-m", "pip", "install", "-q", wheel])
    return env / "bin"


def run(argv: list) -> str:
    done = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_the_installed_wheel_brings_no_django_and_answers_help(installed):
    listed = json.loads(run([installed / "python", "-m", "pip", "list", "--format", "json"]))
    names = {package["name"].lower() for package in listed}

    assert "sn-agent" in names and "websockets" in names
    assert not names & {"django", "celery", "channels", "pyspark"}
    assert "check-config" in run([installed / "sn-agent", "--help"])


@pytest.mark.django_db(transaction=True)
def test_the_installed_agent_checks_its_config_and_runs_an_action(
    installed, asgi_server, web_server, tmp_path
):
    agent = verifying_agent(tmp_path, asgi_server, web_server)
    checked = run([installed / "sn-agent", "check-config", "--config", agent.config])
    assert "ok (4 static attributes, 1 providers, 4 actions; acts only on signed events)" in checked

    agent.start([installed / "sn-agent"])
    try:
        delivery: Delivery = wait_answered(command(web_server, "disable-cgi"))
    finally:
        out = agent.stop(signal.SIGTERM)
    assert delivery.state == "acked" and delivery.receiver.name == SERVER, out
    assert '"event": "stopped"' in out
