"""The server-time echo over a real WebSocket to a real Daphne, through Redis."""

import json
import time

import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from tests.cast import OPERATOR

pytestmark = pytest.mark.django_db(transaction=True)


def socket_url(base_url: str) -> str:
    return base_url.replace("http://", "ws://") + "/ws/time/"


def logged_in_cookie(client, operator) -> str:
    client.login(username=OPERATOR.username, password=OPERATOR.password)
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


def test_a_message_that_is_not_a_ping_gets_an_error_frame_and_the_socket_stays(
    asgi_server, client, operator
):
    headers = {"Cookie": logged_in_cookie(client, operator), "Origin": asgi_server}
    with connect(socket_url(asgi_server), additional_headers=headers) as ws:
        ws.send(json.dumps({"type": "dance"}))
        error = json.loads(ws.recv(timeout=10))
        ws.send(json.dumps({"type": "ping", "sent": 1}))
        reply = json.loads(ws.recv(timeout=10))
    assert error == {"type": "error", "error": 'expected {"type": "ping"}'}
    assert reply["type"] == "time"


def test_a_socket_from_a_foreign_origin_is_refused(asgi_server, client, operator):
    headers = {"Cookie": logged_in_cookie(client, operator), "Origin": "http://evil.example"}
    with pytest.raises(InvalidStatus) as refused:
        connect(socket_url(asgi_server), additional_headers=headers)
    assert refused.value.response.status_code == 403
