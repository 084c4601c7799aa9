"""Agents' presence: sessions counted by real sockets to a real Uvicorn, last seen
written at most every PRESENCE_REFRESH_S, and the one rule for "connected"."""

from __future__ import annotations

import json
import time
from datetime import timedelta

import pytest
from django.db import DatabaseError, connection
from django.utils import timezone
from websockets.sync.client import connect

from broker import protocol
from broker.errors import InvalidInput
from broker.models import AgentPresence, Client
from broker.reads.presence import (
    LAST_SEEN_BUCKETS,
    connected_q,
    is_connected,
    last_seen_bucket,
    last_seen_q,
    presence_changed_since,
    presence_of,
    presence_window,
)
from broker.services import presence
from tests.broker.agent_helpers import RawAgentSocket, agent_url, wait_for
from tests.broker.failing_database import inserts_refused

pytestmark = pytest.mark.django_db(transaction=True)

QUICK_REFRESH_S = 2


def logged_in(ws, token: str) -> None:
    ws.send(json.dumps({"type": "login", "token": token, "ref": "in"}))
    types = [json.loads(ws.recv(timeout=10))["type"] for _ in range(2)]
    assert types == ["welcome", "replayed"]


def heartbeat(ws) -> None:
    ws.send(json.dumps({"type": "heartbeat"}))
    assert json.loads(ws.recv(timeout=10))["type"] == "heartbeat"


def sessions_become(client: Client, count: int) -> None:
    def holds() -> bool:
        found = presence_of(client)
        return found is not None and found.sessions == count

    wait_for(holds, f"{count} sessions")


def make_stale(client: Client) -> None:
    """As if the client had not been seen for longer than the window."""
    long_ago = timezone.now() - presence_window() - timedelta(seconds=1)
    AgentPresence.objects.filter(client=client).update(last_seen_at=long_ago)


@pytest.fixture(scope="module")
def quick_refresh_server(django_db_setup, django_db_blocker, serve_console):
    """A web process that writes last seen every QUICK_REFRESH_S instead of every 30 s."""
    with serve_console({"PRESENCE_REFRESH_S": str(QUICK_REFRESH_S)}) as base_url:
        yield base_url


# Through real sockets -------------------------------------------------------------------


def test_login_makes_the_client_connected_with_one_session(asgi_server, cast):
    client = cast["server_client"]
    assert presence_of(client) is None
    with connect(agent_url(asgi_server)) as ws:
        logged_in(ws, cast["server"])
        sessions_become(client, 1)
        found = presence_of(client)
    assert is_connected(found, timezone.now())
    assert found.connected_since is not None and found.last_peer.startswith("127.0.0.1:")


def test_a_forwarded_for_header_changes_no_peer_the_server_records(asgi_server, cast):
    # An agent that claims to come from elsewhere: the web server trusts no proxy
    # header, so the peer (which login lockouts also count by) is who connected.
    client = cast["server_client"]
    forged = {"X-Forwarded-For": "203.0.113.9", "X-Real-IP": "203.0.113.9"}
    with connect(agent_url(asgi_server), additional_headers=forged) as ws:
        logged_in(ws, cast["server"])
        sessions_become(client, 1)
    assert presence_of(client).last_peer.startswith("127.0.0.1:")


def test_two_sockets_are_two_sessions_and_closing_both_leaves_none(asgi_server, cast):
    client = cast["server_client"]
    url = agent_url(asgi_server)
    with connect(url) as first, connect(url) as second:
        logged_in(first, cast["server"])
        logged_in(second, cast["server"])
        sessions_become(client, 2)
        since = presence_of(client).connected_since
        first.close()
        sessions_become(client, 1)
        assert presence_of(client).connected_since == since
    sessions_become(client, 0)
    closed = presence_of(client)
    assert closed.connected_since is None and closed.last_seen_at is not None
    assert not is_connected(closed, timezone.now())


def test_a_session_the_server_closes_ends_even_if_the_agent_talks_past_the_close(asgi_server, cast):
    """An agent flooding its socket is closed; the frames it sent after the close are
    still read, and their answers meet a closing socket: the session must still end."""
    client = cast["server_client"]
    with RawAgentSocket(agent_url(asgi_server)) as raw:
        raw.send({"type": "login", "token": cast["server"], "ref": "in"})
        assert [raw.receive()["type"] for _ in range(2)] == ["welcome", "replayed"]
        sessions_become(client, 1)
        flood = protocol.BURST + protocol.ABUSE_LIMIT + 20
        raw.send_all([{"type": "heartbeat"}] * flood)  # never answers the close
        sessions_become(client, 0)


def test_a_refused_login_records_no_session(asgi_server, cast):
    with connect(agent_url(asgi_server)) as ws:
        ws.send(json.dumps({"type": "login", "token": "snt_nonsense"}))
        assert json.loads(ws.recv(timeout=10))["type"] == "error"
    time.sleep(0.5)
    assert not AgentPresence.objects.exists()


def test_heartbeats_within_the_refresh_interval_do_not_write(asgi_server, cast):
    client = cast["server_client"]
    with connect(agent_url(asgi_server)) as ws:
        logged_in(ws, cast["server"])
        sessions_become(client, 1)
        before = presence_of(client).updated_at
        for _ in range(5):
            heartbeat(ws)
        ws.send(json.dumps({"type": "received", "position": 0}))
        assert json.loads(ws.recv(timeout=10))["type"] == "ok"
        time.sleep(0.5)  # what a write would have taken, and more
        assert presence_of(client).updated_at == before


def test_a_heartbeat_after_the_refresh_interval_writes_last_seen(quick_refresh_server, cast):
    client = cast["server_client"]
    with connect(agent_url(quick_refresh_server)) as ws:
        logged_in(ws, cast["server"])
        sessions_become(client, 1)
        opened = presence_of(client)
        heartbeat(ws)
        time.sleep(0.3)
        assert presence_of(client).last_seen_at == opened.last_seen_at
        time.sleep(QUICK_REFRESH_S)
        heartbeat(ws)
        wait_for(lambda: presence_of(client).last_seen_at > opened.last_seen_at, "last seen moves")
        assert presence_of(client).connected_since == opened.connected_since


def test_a_session_whose_presence_cannot_be_written_goes_on(asgi_server, cast):
    with inserts_refused("broker_agentpresence"):
        with connect(agent_url(asgi_server)) as ws:
            logged_in(ws, cast["server"])
            heartbeat(ws)
            time.sleep(0.3)
            heartbeat(ws)
        time.sleep(0.5)  # the close's write fails too
    assert presence_of(cast["server_client"]) is None


def test_a_stale_row_does_not_count_as_connected(asgi_server, cast):
    client = cast["server_client"]
    with connect(agent_url(asgi_server)) as ws:
        logged_in(ws, cast["server"])
        sessions_become(client, 1)
        make_stale(client)  # as a killed web process leaves it
        now = timezone.now()
        assert not is_connected(presence_of(client), now)
        assert not AgentPresence.objects.filter(connected_q(now)).exists()
        assert client not in Client.objects.filter(connected_q(now, via="presence__"))


# The service and the selectors --------------------------------------------------------


def test_a_session_opened_after_the_row_went_stale_starts_the_count_afresh(cast):
    client = cast["server_client"]
    for _ in range(3):  # sessions a killed process never closed
        presence.session_opened(client_id=client.pk, peer="10.0.0.1:5000")
    make_stale(client)
    presence.session_opened(client_id=client.pk, peer="10.0.0.2:6000")
    found = presence_of(client)
    assert (found.sessions, found.last_peer) == (1, "10.0.0.2:6000")
    assert found.connected_since > timezone.now() - timedelta(seconds=5)


def test_closing_more_sessions_than_were_opened_never_goes_below_zero(cast):
    client = cast["server_client"]
    presence.session_closed(client_id=client.pk)
    presence.session_opened(client_id=client.pk, peer="10.0.0.1:5000")
    presence.session_closed(client_id=client.pk)
    presence.session_closed(client_id=client.pk)
    assert (presence_of(client).sessions, presence_of(client).connected_since) == (0, None)


def test_seen_writes_only_a_row_older_than_the_refresh_interval(cast):
    client = cast["server_client"]
    assert presence.seen(client_id=client.pk)  # no row: the seen session is one
    assert presence_of(client).sessions == 1
    assert not presence.seen(client_id=client.pk)
    make_stale(client)
    assert presence.seen(client_id=client.pk)
    assert is_connected(presence_of(client), timezone.now())


def test_one_call_records_the_changes_of_many_clients_and_tells_which_seen_it_wrote(cast):
    first, second, third = Client.objects.order_by("pk")[:3]
    presence.seen(client_id=third.pk)  # fresh: seeing it again writes nothing
    written = presence.record(
        [
            presence.PresenceChange(third.pk, presence.Kind.SEEN),
            presence.PresenceChange(first.pk, presence.Kind.OPENED, 'say "hi",{x}:1'),
            presence.PresenceChange(second.pk, presence.Kind.CLOSED),
        ]
    )
    assert written == [False, True, True]
    assert (presence_of(first).sessions, presence_of(first).last_peer) == (1, 'say "hi",{x}:1')
    assert presence_of(second).sessions == 0


def test_a_batch_is_written_whole_or_not_at_all(cast):
    first, second = Client.objects.order_by("pk")[:2]
    batch = [
        presence.PresenceChange(first.pk, presence.Kind.OPENED, "10.0.0.1:1"),
        presence.PresenceChange(second.pk, presence.Kind.CLOSED),
    ]
    refused = inserts_refused(AgentPresence._meta.db_table, "NEW.sessions = 0")
    with refused, pytest.raises(DatabaseError):
        presence.record(batch)
    assert presence_of(first) is None  # opened first, undone with the close that failed


def test_a_batch_takes_one_change_per_client(cast):
    client = cast["server_client"]
    twice = [presence.PresenceChange(client.pk, presence.Kind.SEEN)] * 2
    with pytest.raises(ValueError, match="one change per client"):
        presence.record(twice)


def test_a_long_peer_address_is_shortened(cast):
    client = cast["server_client"]
    presence.session_opened(client_id=client.pk, peer="[" + "f" * 100 + "]:1")
    assert len(presence_of(client).last_peer) == 64


def test_clients_without_a_row_are_not_connected_and_never_seen(cast):
    now = timezone.now()
    servers = Client.objects.filter(model__name="web-server")
    assert not servers.filter(connected_q(now, via="presence__")).exists()
    assert servers.exclude(connected_q(now, via="presence__")).count() == 4
    assert servers.filter(last_seen_q("never", now, via="presence__")).count() == 4
    assert last_seen_bucket(None, now) == "never"


AGES = {
    timedelta(seconds=-5): "within 1 minute",
    timedelta(0): "within 1 minute",
    timedelta(seconds=59): "within 1 minute",
    timedelta(minutes=1, seconds=1): "within 1 hour",
    timedelta(hours=2): "within 1 day",
    timedelta(days=1, seconds=1): "over 1 day",
    timedelta(days=400): "over 1 day",
}


def test_last_seen_buckets_in_python_and_in_sql_agree(cast):
    now = timezone.now()
    clients = list(Client.objects.order_by("pk")[: len(AGES)])
    for client, age in zip(clients, AGES, strict=True):
        AgentPresence.objects.create(
            client=client, sessions=0, last_seen_at=now - age, updated_at=now
        )
        assert last_seen_bucket(now - age, now) == AGES[age]
    rows = AgentPresence.objects.all()
    for bucket in LAST_SEEN_BUCKETS:
        expected = list(AGES.values()).count(bucket)
        assert rows.filter(last_seen_q(bucket, now)).count() == expected, bucket


def test_an_unknown_last_seen_bucket_is_refused_naming_the_field():
    with pytest.raises(InvalidInput) as refused:
        last_seen_q("yesterday", timezone.now())
    assert refused.value.field == "last_seen"


def test_connected_in_python_and_in_sql_agree(cast):
    now = timezone.now()
    window = presence_window()
    cases = [(1, timedelta(0)), (1, window - timedelta(seconds=1)), (1, window), (0, timedelta(0))]
    clients = list(Client.objects.order_by("pk")[: len(cases)])
    for client, (sessions, age) in zip(clients, cases, strict=True):
        AgentPresence.objects.create(
            client=client, sessions=sessions, last_seen_at=now - age, updated_at=now
        )
    rows = AgentPresence.objects.all()
    in_python = {r.client_id for r in rows if is_connected(r, now)}
    assert in_python == set(rows.filter(connected_q(now)).values_list("client_id", flat=True))
    assert in_python == {clients[0].pk, clients[1].pk}


def test_an_incremental_reader_gets_the_rows_changed_since_a_moment(cast):
    first, second = Client.objects.order_by("pk")[:2]
    presence.session_opened(client_id=first.pk, peer="10.0.0.1:1")
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        moment = cursor.fetchone()[0]
    time.sleep(0.01)
    presence.session_opened(client_id=second.pk, peer="10.0.0.2:2")
    assert [r.client_id for r in presence_changed_since(moment)] == [second.pk]
    presence.session_closed(client_id=first.pk)
    assert [r.client_id for r in presence_changed_since(moment)] == [second.pk, first.pk]
