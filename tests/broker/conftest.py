"""Fixtures the agent-side tests share."""

from __future__ import annotations

import pytest

from broker.dispatch import entry
from broker.services.clients import issue_token
from demo.scenario import load_scenario
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


@pytest.fixture
def tree_left_alone(monkeypatch):
    """In tests that commit, the suite's tree worker (tests/conftest.py) would route the
    published events and apply logged changes itself, racing the test for the leaf's
    lock: neither the events' first hops nor the leaf's wake-ups leave this process."""
    monkeypatch.setattr(entry.transport, "send", lambda hops: None)
    monkeypatch.setattr(entry.wakeups, "wake", lambda *args: None)
