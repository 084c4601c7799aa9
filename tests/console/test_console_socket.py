"""The console socket over a real WebSocket to a real Uvicorn, through Redis: the
server-time echo, and live announcements of what a page watches. In this process (the
real channel layer, no web server): the socket of a session that ended is refused, and
an open one closes when its session ends, unless the user's requests moved the end."""

import asyncio
import json
import time

import pytest
from channels.auth import AuthMiddlewareStack
from channels.layers import channel_layers
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.conf import settings
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from console import sessions
from console.consumers import CLOSE_SESSION_ENDED
from console.routing import websocket_urlpatterns
from tests.cast import AUDITOR, create_member, log_in_proved

pytestmark = pytest.mark.django_db(transaction=True)


def socket_url(base_url: str) -> str:
    return base_url.replace("http://", "ws://") + "/ws/console/"


def logged_in_cookie(client, operator) -> str:
    log_in_proved(client, operator)
    return f"sessionid={client.cookies['sessionid'].value}"


def test_logged_in_page_gets_server_time_after_a_channel_layer_round_trip(
    asgi_server, client, operator
):
    headers = {"Cookie": logged_in_cookie(client, operator), "Origin": asgi_server}
    with connect(socket_url(asgi_server), additional_headers=headers, open_timeout=10) as ws:
        ws.send(json.dumps({"type": "ping", "sent": 12.5}))
        reply = json.loads(ws.recv(timeout=10))
    assert reply["type"] == "time"
    assert reply["client_sent"] == 12.5
    assert reply["layer_ms"] >= 0
    assert reply["server_time"].startswith(time.strftime("%Y-", time.gmtime()))


def test_anonymous_socket_is_closed_with_the_unauthenticated_code(asgi_server):
    headers = {"Origin": asgi_server}
    with (
        connect(socket_url(asgi_server), additional_headers=headers) as ws,
        pytest.raises(ConnectionClosed) as closed,
    ):
        ws.recv(timeout=10)
    assert closed.value.rcvd.code == 4401


def test_an_operators_session_without_its_second_factor_is_closed_as_unauthenticated(
    asgi_server, client, operator
):
    client.force_login(operator)  # the password only: no code typed
    headers = {"Cookie": f"sessionid={client.cookies['sessionid'].value}", "Origin": asgi_server}
    with (
        connect(socket_url(asgi_server), additional_headers=headers) as ws,
        pytest.raises(ConnectionClosed) as closed,
    ):
        ws.recv(timeout=10)
    assert closed.value.rcvd.code == 4401


def test_a_message_that_is_not_a_ping_gets_an_error_frame_and_the_socket_stays(
    asgi_server, client, operator
):
    headers = {"Cookie": logged_in_cookie(client, operator), "Origin": asgi_server}
    with connect(socket_url(asgi_server), additional_headers=headers) as ws:
        ws.send(json.dumps({"type": "dance"}))
        error = json.loads(ws.recv(timeout=10))
        ws.send(json.dumps({"type": "ping", "sent": 1}))
        reply = json.loads(ws.recv(timeout=10))
    assert error["type"] == "error" and "expected" in error["error"]
    assert reply["type"] == "time"


def test_a_socket_from_a_foreign_origin_is_refused(asgi_server, client, operator):
    headers = {"Cookie": logged_in_cookie(client, operator), "Origin": "http://evil.example"}
    with pytest.raises(InvalidStatus) as refused:
        connect(socket_url(asgi_server), additional_headers=headers)
    assert refused.value.response.status_code == 403


def test_a_watched_client_is_announced_when_an_officer_changes_it(asgi_server, client, operator):
    from broker.audit import Actor
    from broker.services.clients import state_attributes
    from demo.scenario import load_scenario

    server = load_scenario(servers=1).servers[0]
    headers = {"Cookie": logged_in_cookie(client, operator), "Origin": asgi_server}
    topics = [f"client.{server.pk}", "fleet"]
    with connect(socket_url(asgi_server), additional_headers=headers) as ws:
        ws.send(json.dumps({"type": "watch", "topics": topics}))
        assert json.loads(ws.recv(timeout=10)) == {"type": "watching", "topics": topics}
        state_attributes(client=server, values={"load": 0.9}, actor=Actor("client", "x"))
        announced = {json.loads(ws.recv(timeout=10))["topic"] for _ in range(2)}
    assert announced == set(topics)


def test_pages_of_one_process_are_told_only_of_the_topics_each_watches(
    asgi_server, client, operator
):
    from broker.push import to_consoles

    headers = {"Cookie": logged_in_cookie(client, operator), "Origin": asgi_server}
    url = socket_url(asgi_server)
    with (
        connect(url, additional_headers=headers) as one,
        connect(url, additional_headers=headers) as other,
    ):
        for page, topic in ((one, "client.1"), (other, "client.2")):
            page.send(json.dumps({"type": "watch", "topics": [topic]}))
            assert json.loads(page.recv(timeout=10))["type"] == "watching"
        # Both announced at once: their process receives one message for the two pages.
        to_consoles.clients_changed([1, 2])
        assert json.loads(one.recv(timeout=10))["topic"] == "client.1"
        assert json.loads(other.recv(timeout=10))["topic"] == "client.2"
        with pytest.raises(TimeoutError):
            one.recv(timeout=1)


def test_watching_something_else_is_refused_with_an_error(asgi_server, client, operator):
    headers = {"Cookie": logged_in_cookie(client, operator), "Origin": asgi_server}
    with connect(socket_url(asgi_server), additional_headers=headers) as ws:
        ws.send(json.dumps({"type": "watch", "topics": ["client.1; drop"]}))
        error = json.loads(ws.recv(timeout=10))
    assert error["type"] == "error" and "topics" in error["error"]


IDLE_S = settings.SESSION_IDLE_MIN * 60


def socket_in_this_process(client) -> WebsocketCommunicator:
    """The console's socket as the web process routes it, with `client`'s cookie."""
    cookie = f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"
    return WebsocketCommunicator(
        AuthMiddlewareStack(URLRouter(websocket_urlpatterns)),
        "/ws/console/",
        headers=[(b"cookie", cookie.encode())],
    )


@pytest.fixture
def own_channel_layer():
    """A channel layer of the test's own: a layer's locks belong to the event loop that
    first used them, and each test here runs one of its own (asyncio.run)."""
    kept = dict(channel_layers.backends)
    channel_layers.backends.clear()
    yield
    channel_layers.backends.clear()
    channel_layers.backends.update(kept)


@pytest.fixture
def clock_moved_on(monkeypatch, own_channel_layer):
    """Move the sessions' clock on by a number of seconds from now on."""

    def move(seconds: float) -> None:
        monkeypatch.setattr(sessions, "now", lambda: time.time() + seconds)

    return move


async def close_code_within(socket: WebsocketCommunicator, timeout_s: float) -> int:
    connected, _ = await socket.connect(timeout=5)
    assert connected
    closed = await socket.receive_output(timeout=timeout_s)
    await socket.disconnect()  # the browser's answer to the close
    assert closed["type"] == "websocket.close"
    return closed["code"]


def test_the_socket_of_a_session_that_ended_is_closed_at_once(client, operator, clock_moved_on):
    log_in_proved(client, operator)
    client.get("/fleet/")  # the session is timed from its first request
    clock_moved_on(IDLE_S + 1)
    socket = socket_in_this_process(client)
    assert asyncio.run(close_code_within(socket, timeout_s=5)) == CLOSE_SESSION_ENDED


def test_an_open_socket_closes_when_its_session_idles_out(client, operator, clock_moved_on):
    log_in_proved(client, operator)
    client.get("/fleet/")
    clock_moved_on(IDLE_S - 1)  # a second before its end

    async def opened_then_closed() -> tuple[dict, int]:
        socket = socket_in_this_process(client)
        await socket.connect(timeout=5)
        await socket.send_json_to({"type": "ping", "sent": 1})
        answer = await socket.receive_json_from(timeout=5)
        closed = await socket.receive_output(timeout=5)
        await socket.disconnect()
        return answer, closed["code"]

    answer, code = asyncio.run(opened_then_closed())
    assert answer["type"] == "time" and code == CLOSE_SESSION_ENDED


def test_the_users_requests_keep_the_socket_open_past_the_end_it_connected_with(
    client, operator, clock_moved_on
):
    log_in_proved(client, operator)
    client.get("/fleet/")
    clock_moved_on(IDLE_S - 1)

    async def still_open_after_the_first_end() -> dict:
        socket = socket_in_this_process(client)
        await socket.connect(timeout=5)
        await asyncio.to_thread(client.get, "/fleet/")  # activity: the end moves on
        await asyncio.sleep(2)
        await socket.send_json_to({"type": "ping", "sent": 2})
        answer = await socket.receive_json_from(timeout=5)
        await socket.disconnect()
        return answer

    assert asyncio.run(still_open_after_the_first_end())["type"] == "time"


def test_an_auditors_socket_stays_open_past_any_idle_limit(client, clock_moved_on):
    log_in_proved(client, create_member(AUDITOR))
    client.get("/audit/")
    clock_moved_on(13 * 3600)

    async def answered() -> dict:
        socket = socket_in_this_process(client)
        await socket.connect(timeout=5)
        await socket.send_json_to({"type": "ping", "sent": 3})
        answer = await socket.receive_json_from(timeout=5)
        await socket.disconnect()
        return answer

    assert asyncio.run(answered())["type"] == "time"
