"""The agent library (sn_agent.client) against scripted servers that misbehave as real
ones do: logins closed with 1011, pushes out of order, repeated or lost. The
application must see each delivery once, in position order, over one session."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable

import pytest
from sn_agent import client as library
from sn_agent.client import Agent, Notification
from websockets.asyncio.server import ServerConnection, serve
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.frames import Close
from websockets.http11 import Response

from broker.protocol import TokenBucket

Script = Callable[[ServerConnection, dict, "FakeServer"], Awaitable[None]]


class FakeServer:
    """A WebSocket server that answers each login with the next script and records
    every frame the agent sent and how many sessions are open."""

    def __init__(self, *scripts: Script) -> None:
        self.scripts = list(scripts)
        self.logins: list[dict] = []
        self.frames: list[dict] = []
        self.open_sessions = 0
        self.most_open = 0

    async def handle(self, socket: ServerConnection) -> None:
        self.open_sessions += 1
        self.most_open = max(self.most_open, self.open_sessions)
        try:
            login = json.loads(await socket.recv())
            self.logins.append(login)
            await self.scripts.pop(0)(socket, login, self)
            async for text in socket:
                await self._answer(socket, json.loads(text))
        except Exception:  # the agent went away; the session is over
            pass
        finally:
            self.open_sessions -= 1

    async def _answer(self, socket: ServerConnection, frame: dict) -> None:
        self.frames.append(frame)
        if frame["type"] == "received":
            await send(socket, {"type": "ok", "ref": frame["ref"], "last_position": 0})
        elif frame["type"] in ("resend", "ack"):
            handler = getattr(self, f"on_{frame['type']}", None)
            if handler is not None:
                await handler(socket, frame)


async def send(socket: ServerConnection, frame: dict) -> None:
    await socket.send(json.dumps(frame))


def notification(position: int) -> dict:
    return {
        "type": "notification",
        "delivery": 1000 + position,
        "position": position,
        "event": f"event-{position}",
        "sender": 7,
        "channel": "default",
        "sequence": position,
        "content": {"n": position},
        "replay": False,
    }


async def welcome(socket: ServerConnection, login: dict, through: int = 0) -> None:
    await send(socket, {"type": "welcome", "ref": login["ref"], "heartbeat_s": 30})
    await send(socket, {"type": "replayed", "ref": login["ref"], "count": 0, "through": through})


def close_1011(delay_s: float = 0.0) -> Script:
    async def script(socket, login, server) -> None:
        await asyncio.sleep(delay_s)
        await socket.close(code=1011, reason="internal error")

    return script


def push(*positions: int) -> Script:
    async def script(socket, login, server) -> None:
        await welcome(socket, login)
        for position in positions:
            await send(socket, notification(position))

    return script


def handshakes(server: FakeServer) -> dict:
    """How `server` answers handshakes: its own process_request, if it has one."""
    process_request = getattr(server, "process_request", None)
    return {"process_request": process_request} if process_request else {}


async def received_by_application(
    server: FakeServer, count: int, answer=None, until=lambda: True
) -> list[Notification]:
    """Run an agent against `server` until the application has `count` notifications
    (answering each with `answer`, if given) and `until()` holds."""
    taken: list[Notification] = []

    def handler(notification: Notification):
        taken.append(notification)
        return answer

    async with serve(server.handle, "127.0.0.1", 0, **handshakes(server)) as listening:
        port = listening.sockets[0].getsockname()[1]
        agent = Agent(f"ws://127.0.0.1:{port}/", "snt_test")
        running = asyncio.create_task(agent.run(handler))
        while len(taken) < count or not until():
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.3)  # anything more would arrive now
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        await agent.close()
    return taken


@pytest.fixture(autouse=True)
def quick_reconnects(monkeypatch):
    monkeypatch.setattr(library, "RECONNECT_FIRST_S", 0.05)
    monkeypatch.setattr(library, "GAP_WAIT_S", 0.2)


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, timeout=30))


def test_logins_closed_with_1011_leave_one_session_and_each_notification_once():
    server = FakeServer(close_1011(), close_1011(0.1), push(*range(1, 11)))
    taken = run(received_by_application(server, 10))
    assert [n.position for n in taken] == list(range(1, 11))
    assert len(server.logins) == 3 and server.most_open == 1


def test_repeated_and_overtaking_pushes_reach_the_application_once_in_order():
    server = FakeServer(push(1, 3, 2, 2, 4, 1, 4))
    taken = run(received_by_application(server, 4))
    assert [n.position for n in taken] == [1, 2, 3, 4]


def test_a_gap_that_does_not_fill_itself_is_asked_for_again():
    server = FakeServer(push(1, 3))

    async def on_resend(socket, frame) -> None:
        await send(socket, notification(2))
        await send(socket, notification(3))
        await send(socket, {"type": "replayed", "ref": frame["ref"], "count": 2, "through": 3})

    server.on_resend = on_resend
    taken = run(received_by_application(server, 3))
    assert [n.position for n in taken] == [1, 2, 3]
    assert any(f["type"] == "resend" and f["after_position"] == 1 for f in server.frames)


def test_positions_gone_by_the_time_of_a_replay_are_skipped_not_awaited():
    server = FakeServer(push(1, 4))

    async def on_resend(socket, frame) -> None:  # 2 and 3 expired: nothing to send
        await send(socket, {"type": "replayed", "ref": frame["ref"], "count": 0, "through": 3})

    server.on_resend = on_resend
    taken = run(received_by_application(server, 2))
    assert [n.position for n in taken] == [1, 4]


def test_a_reconnecting_agent_resumes_after_the_last_position_it_took_in():
    async def first(socket, login, server) -> None:
        await welcome(socket, login)
        for position in (1, 2):
            await send(socket, notification(position))
        await asyncio.sleep(0.1)
        await socket.close(code=1011)

    server = FakeServer(first, push(2, 3))
    taken = run(received_by_application(server, 3))
    assert [n.position for n in taken] == [1, 2, 3]
    assert "after_position" not in server.logins[0]
    assert server.logins[1]["after_position"] == 2


def test_the_agent_confirms_what_it_has():
    server = FakeServer(push(1, 2, 3))
    run(received_by_application(server, 3))
    confirmed = [f["position"] for f in server.frames if f["type"] == "received"]
    assert confirmed and confirmed[-1] == 3


def test_an_answer_confirms_what_the_agent_has_and_no_separate_confirmation_follows():
    server = FakeServer(push(1, 2, 3))

    async def on_ack(socket, frame) -> None:
        confirmed = {"last_position": 3, "confirmed_position": frame.get("position", 0)}
        await send(socket, {"type": "ok", "ref": frame["ref"], **confirmed})

    server.on_ack = on_ack
    run(received_by_application(server, 3, answer=("ok", None)))
    acks = [frame for frame in server.frames if frame["type"] == "ack"]
    assert acks[0]["position"] == 3 and all("position" not in ack for ack in acks[1:])
    assert [frame for frame in server.frames if frame["type"] == "received"] == []


def test_an_answer_to_a_server_that_does_not_confirm_with_it_is_still_confirmed_apart():
    server = FakeServer(push(1))

    async def on_ack(socket, frame) -> None:  # a server of an earlier revision
        await send(socket, {"type": "ok", "ref": frame["ref"]})

    server.on_ack = on_ack
    confirmed = lambda: [f for f in server.frames if f["type"] == "received"]  # noqa: E731
    run(received_by_application(server, 1, answer=("ok", None), until=confirmed))
    assert confirmed()[-1]["position"] == 1


def test_an_answer_the_server_failed_to_record_is_sent_again_after_reconnecting():
    server = FakeServer(push(1), push())
    acks: list[tuple[int, str]] = []

    async def on_ack(socket, frame) -> None:
        acks.append((frame["delivery"], frame["status"]))
        if len(acks) == 1:  # the database was down: the server says it failed
            error = {"type": "error", "ref": frame["ref"], "code": "internal"}
            await send(socket, {**error, "message": "the server failed", "field": None})
        else:
            await send(socket, {"type": "ok", "ref": frame["ref"]})

    server.on_ack = on_ack

    answer = ("ok", {"exit_code": 0})
    run(received_by_application(server, 1, answer=answer, until=lambda: len(acks) >= 2))
    assert acks == [(1001, "ok"), (1001, "ok")] and len(server.logins) == 2


def test_an_answer_refused_for_good_does_not_stop_the_agent():
    server = FakeServer(push(1, 2))

    async def on_ack(socket, frame) -> None:
        error = {"type": "error", "ref": frame["ref"], "code": "invalid", "field": "delivery"}
        await send(socket, {**error, "message": "already answered"})

    server.on_ack = on_ack
    taken = run(received_by_application(server, 2, answer=("ok", None)))
    assert [n.position for n in taken] == [1, 2] and len(server.logins) == 1


def test_cancelling_an_agent_waiting_as_its_session_ends_is_never_swallowed():
    # A fleet stopped while the console stops too: its agents' sessions end at the
    # moment they are cancelled. A cancellation lost there left the agent reconnecting
    # forever, and the fleet process hanging on its way out.
    async def cancelled_after(yields: int) -> bool:
        """True if the wait, cancelled after `yields` turns of the loop, raised."""
        queue, ended = asyncio.Queue(), asyncio.get_running_loop().create_future()
        waiting = asyncio.create_task(library._next_unless_ended(queue, ended))
        await asyncio.sleep(0)
        ended.set_result(ConnectionError("closed"))
        for _ in range(yields):
            await asyncio.sleep(0)
        if not waiting.cancel():
            return True  # it had returned already: nothing to swallow
        try:
            await waiting
        except asyncio.CancelledError:
            return True
        return False

    async def every_moment() -> list[bool]:
        return [await cancelled_after(yields) for yields in range(8)]

    assert all(run(every_moment()))


def test_cancelling_a_request_as_its_answer_arrives_is_never_swallowed():
    class Socket:
        async def send(self, text: str) -> None:
            pass

    async def scenario() -> bool:
        agent = Agent("ws://unused/", "snt_test")
        agent._session = library._Session(Socket())
        asking = asyncio.create_task(agent.heartbeat())
        await asyncio.sleep(0)
        (future,) = agent._session.pending.values()
        future.set_result({"type": "heartbeat"})
        asking.cancel()
        try:
            await asking
        except asyncio.CancelledError:
            return True
        return False

    assert run(scenario())


def busy(retry_after_s, *, answering_the_login: bool = True) -> Script:
    """A console busy with other logins: it says when to come back, as the answer to
    the login or as the connection opens (no ref), and closes 4503."""

    async def script(socket, login, server) -> None:
        ref = login["ref"] if answering_the_login else None
        refusal = {"type": "error", "ref": ref, "code": "busy", "field": None}
        refusal.update(message="try again later", retry_after_s=retry_after_s)
        await send(socket, refusal)
        await socket.close(code=4503, reason="try again later")

    return script


class TimedServer(FakeServer):
    """Records when each login arrived."""

    def __init__(self, *scripts: Script) -> None:
        super().__init__(*scripts)
        self.login_times: list[float] = []

    async def handle(self, socket: ServerConnection) -> None:
        self.login_times.append(asyncio.get_running_loop().time())
        await super().handle(socket)


def test_an_agent_told_the_console_is_busy_comes_back_no_sooner_than_asked():
    server = TimedServer(busy(0.4), busy(0.3, answering_the_login=False), push(1))
    taken = run(received_by_application(server, 1))
    assert [n.position for n in taken] == [1]
    first, second, third = server.login_times
    assert second - first >= 0.4 and third - second >= 0.3


class ClosedAsItOpened:
    """A socket the console refused as busy as it opened and closed before the agent
    sent its login: the send fails, and the `busy` frame waits in the reader."""

    closed = ConnectionClosed(Close(4503, "busy"), Close(4503, "busy"), rcvd_then_sent=True)

    def __init__(self, retry_after_s: float) -> None:
        refusal = {"type": "error", "ref": None, "code": "busy", "field": None}
        self.frames = [json.dumps({**refusal, "message": "busy", "retry_after_s": retry_after_s})]

    def __aiter__(self):
        return self

    async def __anext__(self) -> str:
        await asyncio.sleep(0.05)  # the reader comes to it after the login was tried
        if self.frames:
            return self.frames.pop(0)
        raise self.closed

    async def send(self, text: str) -> None:
        raise self.closed

    async def close(self) -> None:
        pass


def test_a_login_whose_socket_closed_before_it_was_sent_still_honours_the_busy_frame(
    monkeypatch,
):
    # Ten thousand agents at once: the refusal and its close often reached the agent
    # before its login went out, and it came back after its own short back-off,
    # refused again (19,850 refusals for 10,000 logins).
    async def connect(*args, **kwargs):
        return ClosedAsItOpened(retry_after_s=2.5)

    monkeypatch.setattr(library.websockets, "connect", connect)
    with pytest.raises(library.TryAgainLater) as refused:
        run(Agent("ws://unused/", "snt_test").connect())
    assert refused.value.retry_after_s == 2.5
    assert library._asked_to_wait(refused.value) == 2.5


class RefusesHandshakes(TimedServer):
    """Answers the first handshakes with the given HTTP responses instead of opening a
    WebSocket (a busy console's 503), then serves its scripts."""

    def __init__(self, refusals: list[Response], *scripts: Script) -> None:
        super().__init__(*scripts)
        self.refusals = refusals
        self.handshake_times: list[float] = []

    def process_request(self, connection, request) -> Response | None:
        self.handshake_times.append(asyncio.get_running_loop().time())
        return self.refusals.pop(0) if self.refusals else None


def refusal(status: int, *, body: dict | None = None, retry_after: str | None = None):
    headers = Headers({"Retry-After": retry_after} if retry_after is not None else {})
    text = json.dumps(body).encode() if body is not None else b""
    return Response(status, "refused", headers, text)


BUSY_FRAME = {"type": "error", "ref": None, "code": "busy", "message": "busy", "field": None}


def test_an_agent_whose_handshake_the_busy_console_refused_comes_back_no_sooner_than_asked():
    server = RefusesHandshakes(
        [
            refusal(503, body={**BUSY_FRAME, "retry_after_s": 0.4}, retry_after="1"),
            refusal(503, retry_after="1"),  # a legacy client sees the headers alone
        ],
        push(1),
    )

    taken = run(received_by_application(server, 1))
    assert [n.position for n in taken] == [1]
    first, second, third = server.handshake_times
    assert 0.4 <= second - first < 1.0 and third - second >= 1.0


@pytest.mark.parametrize(
    "response",
    [refusal(503), refusal(503, body={"code": "other"}), refusal(502, retry_after="3")],
)
def test_a_refused_handshake_that_is_not_a_busy_console_is_an_ordinary_failure(response):
    server = RefusesHandshakes([response])

    async def scenario() -> BaseException:
        async with serve(server.handle, "127.0.0.1", 0, **handshakes(server)) as listening:
            port = listening.sockets[0].getsockname()[1]
            with pytest.raises(Exception) as failed:
                await Agent(f"ws://127.0.0.1:{port}/", "snt_test").connect()
            return failed.value

    failure = run(scenario())
    assert isinstance(failure, InvalidStatus) and not isinstance(failure, library.TryAgainLater)


@pytest.mark.parametrize(
    ("asked", "waits_at_least", "waits_at_most"),
    [
        (3, 3.0, 3.5),
        (2.5, 2.5, 3.0),
        (-4, 0.0, 0.5),  # nonsense from a server is no reason to hurry or stall
        (float("nan"), 0.0, 0.5),
        (True, 0.0, 0.5),
        ("3", 0.0, 0.5),
        (None, 0.0, 0.5),
        (10**9, 60.0, 60.5),
    ],
)
def test_the_wait_before_reconnecting_is_what_was_asked_plus_a_random_share_of_the_backoff(
    asked, waits_at_least, waits_at_most
):
    refusal = library.AgentError({"code": "busy", "message": "busy", "retry_after_s": asked})
    for _ in range(50):
        wait = library.reconnect_wait(0.5, asked_s=library._asked_to_wait(refusal))
        assert waits_at_least <= wait <= waits_at_most


def test_agents_that_lost_their_connections_together_do_not_come_back_together():
    waits = [library.reconnect_wait(8.0) for _ in range(1000)]
    assert min(waits) < 1.0 and max(waits) > 7.0
    assert 3.0 < sum(waits) / len(waits) < 5.0


def heartbeats_unanswered(socket, login, server) -> Awaitable[None]:
    """A connection that died without closing: the login is answered, nothing after."""

    async def script() -> None:
        await send(socket, {"type": "welcome", "ref": login["ref"], "heartbeat_s": 0.2})
        await send(socket, {"type": "replayed", "ref": login["ref"], "count": 0, "through": 0})
        async for _ in socket:  # read, never answered
            pass

    return script()


def test_a_heartbeat_left_unanswered_ends_the_session_and_the_agent_comes_back(monkeypatch):
    monkeypatch.setattr(library, "REQUEST_TIMEOUT_S", 0.5)
    server = FakeServer(heartbeats_unanswered, push(1))
    taken = run(received_by_application(server, 1))
    assert [n.position for n in taken] == [1] and len(server.logins) == 2


def test_the_agent_sends_no_websocket_pings_its_heartbeat_tells_the_connection_lives():
    async def scenario():
        async with serve(FakeServer(push()).handle, "127.0.0.1", 0) as listening:
            port = listening.sockets[0].getsockname()[1]
            async with Agent(f"ws://127.0.0.1:{port}/", "snt_test") as agent:
                return agent._session.socket.ping_interval

    assert run(scenario()) is None


# Keeping to the server's rate ------------------------------------------------------------


def pushed_under_limits(limits: dict, *positions: int) -> Script:
    async def script(socket, login, server) -> None:
        welcomed = {"type": "welcome", "ref": login["ref"], "heartbeat_s": 30, "limits": limits}
        await send(socket, welcomed)
        await send(socket, {"type": "replayed", "ref": login["ref"], "count": 0, "through": 0})
        for position in positions:
            await send(socket, notification(position))

    return script


def test_an_answer_refused_for_its_rate_is_sent_again_at_once_on_the_same_session():
    limits = {"max_frame_bytes": 65536, "frames_per_s": 50.0, "burst": 200}
    server = FakeServer(pushed_under_limits(limits, 1))
    acks: list[int] = []

    async def on_ack(socket, frame) -> None:
        acks.append(frame["delivery"])
        if len(acks) == 1:  # over the server's limit: not read, refused
            refused = {"type": "error", "ref": frame["ref"], "code": "rate_limited"}
            await send(socket, {**refused, "message": "too fast", "field": "frame"})
        else:
            await send(socket, {"type": "ok", "ref": frame["ref"]})

    server.on_ack = on_ack
    run(received_by_application(server, 1, answer=("ok", None), until=lambda: len(acks) >= 2))
    assert acks == [1001, 1001] and len(server.logins) == 1


def test_the_agent_keeps_its_frames_within_the_rate_and_burst_its_welcome_states():
    limits = {"max_frame_bytes": 65536, "frames_per_s": 20.0, "burst": 4}
    server = FakeServer(pushed_under_limits(limits, *range(1, 31)))
    arrivals: list[float] = []

    async def on_ack(socket, frame) -> None:
        arrivals.append(time.monotonic())
        await send(socket, {"type": "ok", "ref": frame["ref"]})

    server.on_ack = on_ack
    answered = lambda: len(arrivals) >= 30  # noqa: E731
    run(received_by_application(server, 30, answer=("ok", None), until=answered))

    bucket = TokenBucket(rate=20.0, burst=4, tokens=4, updated=arrivals[0])
    refused = 0
    for at in arrivals:  # as the server's own bucket would have taken them
        bucket.tokens = min(bucket.burst, bucket.tokens + (at - bucket.updated) * bucket.rate)
        bucket.updated = at
        refused += bucket.tokens < 1
        bucket.tokens -= bucket.tokens >= 1
    assert refused == 0
