"""Fixtures the agent-side tests share."""

from __future__ import annotations

import pytest

from broker.scenario import load_scenario
from broker.services.clients import issue_token
from tests.broker.agent_helpers import ISSUER
from tests.broker.tree_helpers import wait_until_idle


@pytest.fixture
def cast(celery_worker):
    """The scenario with four web servers; tokens for web-00000 (IIS) and the
    Intellimune national controller."""
    scenario = load_scenario(servers=4)
    wait_until_idle()
    server = next(s for s in scenario.servers if s.name == "web-00000")
    controller = scenario.controllers["intellimune-national"]
    return {
        "server": issue_token(client=server, actor=ISSUER),
        "controller": issue_token(client=controller, actor=ISSUER),
        "server_client": server,
        "controller_client": controller,
        "scenario": scenario,
    }
