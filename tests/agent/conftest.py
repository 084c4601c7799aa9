"""Fixtures of the agent's tests: one web server of the scenario, and its agent."""

from __future__ import annotations

import pytest

from broker.services.clients import issue_token
from demo.scenario import load_scenario
from tests.agent.running_agent import SERVER, RunningAgent
from tests.broker.agent_helpers import ISSUER, agent_url
from tests.broker.tree_helpers import wait_until_idle


@pytest.fixture
def web_server(celery_worker):
    """The scenario with two web servers: (the scenario, web-00000)."""
    scenario = load_scenario(servers=2)
    wait_until_idle()
    server = next(s for s in scenario.servers if s.name == SERVER)
    return scenario, server


@pytest.fixture
def agent(asgi_server, web_server, tmp_path):
    """web-00000's agent, configured in this test's folder and not started yet."""
    _, server = web_server
    running = RunningAgent(
        tmp_path, agent_url(asgi_server), issue_token(client=server, actor=ISSUER)
    )
    yield running
    if running.process is not None:
        if running.process.poll() is None:
            running.process.kill()
        print(running.process.communicate(timeout=30)[0])  # shown when the test fails
