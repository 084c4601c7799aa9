"""The console socket over a real WebSocket to a real Uvicorn, through Redis: the
server-time echo, and live announcements of what a page watches."""

import json
import time

import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from tests.cast import log_in_proved

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


def test_watching_something_else_is_refused_with_an_error(asgi_server, client, operator):
    headers = {"Cookie": logged_in_cookie(client, operator), "Origin": asgi_server}
    with connect(socket_url(asgi_server), additional_headers=headers) as ws:
        ws.send(json.dumps({"type": "watch", "topics": ["client.1; drop"]}))
        error = json.loads(ws.recv(timeout=10))
    assert error["type"] == "error" and "topics" in error["error"]
