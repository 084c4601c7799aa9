"""A web process with too many connections waiting to log in tells the next ones to
come back (`busy`, `retry_after_s`, refusing their handshakes with 503) instead of
letting them time out; the agent library comes back when told, and every agent of a
crowd gets in."""

from __future__ import annotations

import asyncio
import json
import math
from contextlib import ExitStack

import pytest
from sn_agent.client import Agent
from websockets.exceptions import InvalidStatus
from websockets.http11 import Response
from websockets.sync.client import connect

from tests.broker.agent_helpers import agent_url

pytestmark = pytest.mark.django_db(transaction=True)

CROWD = 30


@pytest.fixture(scope="module")
def one_login_at_a_time(django_db_setup, django_db_blocker, serve_console):
    """A web process that lets one connection at a time wait to log in."""
    with serve_console({"AGENT_LOGINS_AT_ONCE": "1"}) as base_url:
        yield base_url


def open_at_once(sockets: ExitStack, url: str, count: int) -> tuple[list, list[Response]]:
    """Open `count` sockets (closed with `sockets`), none logging in yet: the sockets
    opened, and the responses of the handshakes refused."""
    opened, refused = [], []
    for _ in range(count):
        try:
            opened.append(sockets.enter_context(connect(url)))
        except InvalidStatus as refusal:
            refused.append(refusal.response)
    return opened, refused


def test_connections_beyond_those_waiting_to_log_in_are_refused_503_with_when_to_come_back(
    one_login_at_a_time, cast
):
    with ExitStack() as sockets:
        opened, refused = open_at_once(sockets, agent_url(one_login_at_a_time), CROWD)
        assert refused, "every connection was let in to log in"
        for response in refused:
            frame = json.loads(response.body)
            assert response.status_code == 503
            assert frame["code"] == "busy" and 1.0 <= frame["retry_after_s"] <= 60.0
            assert f"try again in {frame['retry_after_s']:g} s" in frame["message"]
            assert response.headers["Retry-After"] == str(math.ceil(frame["retry_after_s"]))
        for index, ws in enumerate(opened):
            ws.send(json.dumps({"type": "login", "token": cast["server"], "ref": index}))
            assert json.loads(ws.recv(timeout=10))["type"] == "welcome"
        assert len(opened) + len(refused) == CROWD


def test_a_crowd_of_agents_told_to_come_back_all_get_in(one_login_at_a_time, cast):
    async def crowd() -> list[dict]:
        agents = [Agent(agent_url(one_login_at_a_time), cast["server"]) for _ in range(CROWD)]
        running = [asyncio.ensure_future(agent.run()) for agent in agents]
        try:
            while sum(agent.logged_in for agent in agents) < CROWD:
                await asyncio.sleep(0.1)
            return [agent.welcome for agent in agents]
        finally:
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)
            await asyncio.gather(*(agent.close() for agent in agents))

    welcomes = asyncio.run(asyncio.wait_for(crowd(), timeout=60))
    assert {welcome["client"] for welcome in welcomes} == {cast["server_client"].name}
