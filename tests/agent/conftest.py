"""Fixtures of the agent's tests: one web server of the scenario, and its agent."""

from __future__ import annotations

import pytest

from demo.scenario import load_scenario
from tests.agent.running_agent import SERVER, verifying_agent
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
    """web-00000's agent, configured in this test's folder as docs/agent.md installs it
    (it verifies signatures), and not started yet."""
    running = verifying_agent(tmp_path, asgi_server, web_server)
    yield running
    if running.process is not None:
        if running.process.poll() is None:
            running.process.kill()
            running.process.wait(timeout=30)
        print(running.log.read_text())  # shown when the test fails
