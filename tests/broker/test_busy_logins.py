"""A web process with too many connections waiting to log in tells the next ones to
come back (`busy`, 4503, `retry_after_s`) instead of letting them time out; the agent
library comes back when told, and every agent of a crowd gets in."""

from __future__ import annotations

import asyncio
import json
from contextlib import ExitStack, suppress

import pytest
from sn_agent.client import Agent
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from broker import protocol
from tests.broker.agent_helpers import agent_url

pytestmark = pytest.mark.django_db(transaction=True)

CROWD = 30


@pytest.fixture(scope="module")
def one_login_at_a_time(django_db_setup, django_db_blocker, serve_console):
    """A web process that lets one connection at a time wait to log in."""
    with serve_console({"AGENT_LOGINS_AT_ONCE": "1"}) as base_url:
        yield base_url


def first_answers(url: str, token: str, count: int) -> list[tuple[dict, int | None]]:
    """Open `count` sockets at once, send a login on each, and read each one's first
    frame and, if the server then closed it, the close code. (A socket refused as it
    opened may be closed before its login is sent.)"""
    with ExitStack() as stack:
        sockets = [stack.enter_context(connect(url)) for _ in range(count)]
        for index, ws in enumerate(sockets):
            with suppress(ConnectionClosed):
                ws.send(json.dumps({"type": "login", "token": token, "ref": index}))
        return [(json.loads(ws.recv(timeout=10)), closed_with(ws)) for ws in sockets]


def closed_with(ws) -> int | None:
    try:
        while True:
            ws.recv(timeout=2)
    except Exception:
        return ws.close_code


def test_connections_beyond_those_waiting_to_log_in_are_told_when_to_come_back_and_closed_4503(
    one_login_at_a_time, cast
):
    answers = first_answers(agent_url(one_login_at_a_time), cast["server"], CROWD)
    busy = [(frame, code) for frame, code in answers if frame["type"] == "error"]
    assert busy, "every login ran at once"
    for frame, code in busy:
        assert frame["code"] == "busy" and 1.0 <= frame["retry_after_s"] <= 60.0
        assert f"try again in {frame['retry_after_s']:g} s" in frame["message"]
        assert code == protocol.CLOSE_TRY_AGAIN_LATER == 4503
    welcomed = [frame for frame, code in answers if frame["type"] == "welcome"]
    assert len(welcomed) + len(busy) == CROWD


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
