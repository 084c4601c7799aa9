"""The agent protocol over real WebSockets to a real Uvicorn, with a real Celery worker
running the tree: login, advertise, policy, publish, receive, ack, reconnect and
replay, and every error case of docs/protocol.md."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request

import pytest
from channels.db import database_sync_to_async as in_thread
from channels.layers import get_channel_layer
from django.conf import settings
from redis import Redis
from sn_agent.client import Agent, AgentError, SessionEnded
from sn_agent.signatures import new_private_key, public_key_text
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from broker.models import AgentPresence, AuditEntry, Client, Delivery, Event
from broker.push.to_agents import client_group
from broker.services.clients import issue_token, revoke_tokens
from broker.services.signing_keys import set_signing_key
from launcher.supervisor import WEB_MAX_MESSAGE_BYTES
from tests.broker.agent_helpers import ISSUER, agent_url, close_code, wait_for
from tests.broker.failing_database import inserts_refused
from tests.broker.tree_helpers import wait_until_idle

pytestmark = pytest.mark.django_db(transaction=True)

COMMAND = {"kind": "command", "action": "disable-cgi"}
IIS_SELECTOR = 'receiver.software == "IIS"'


def frames(ws, count: int) -> list[dict]:
    return [json.loads(ws.recv(timeout=10)) for _ in range(count)]


def logged_in(ws, token: str) -> dict:
    ws.send(json.dumps({"type": "login", "token": token, "ref": "in"}))
    welcome, replayed = frames(ws, 2)
    assert welcome["type"] == "welcome" and replayed["type"] == "replayed"
    return welcome


# Logging in ----------------------------------------------------------------------------


def test_an_unknown_token_gets_an_error_frame_and_the_unauthenticated_close(asgi_server, cast):
    with connect(agent_url(asgi_server)) as ws:
        ws.send(json.dumps({"type": "login", "token": "snt_nonsense", "ref": 1}))
        error = json.loads(ws.recv(timeout=10))
        assert close_code(ws) == 4401
    assert error == {
        "type": "error",
        "ref": 1,
        "code": "authentication_failed",
        "message": "the token is unknown, revoked or expired",
        "field": None,
    }
    assert AuditEntry.objects.filter(action="agent.login", outcome="refused").exists()


def test_anything_but_login_first_is_refused_and_disconnected(asgi_server, cast):
    with connect(agent_url(asgi_server)) as ws:
        ws.send(json.dumps({"type": "publish", "content": COMMAND}))
        error = json.loads(ws.recv(timeout=10))
        assert close_code(ws) == 4401
    assert error["code"] == "authentication_failed" and error["message"] == "log in first"


def test_a_socket_that_never_logs_in_is_closed_after_the_deadline(asgi_server, cast):
    with connect(agent_url(asgi_server)) as ws:
        assert close_code(ws) == 4408


def test_a_session_that_says_nothing_for_three_heartbeats_is_closed_as_silent(asgi_server, cast):
    with connect(agent_url(asgi_server)) as ws:  # this client's pings are no heartbeats
        heartbeat_s = logged_in(ws, cast["server"])["heartbeat_s"]
        quiet_since = time.monotonic()
        assert close_code(ws, timeout_s=6 * heartbeat_s) == 4410
    assert time.monotonic() - quiet_since >= 3 * heartbeat_s - 0.5


def test_login_welcomes_with_protocol_limits_and_an_empty_replay(asgi_server, cast):
    with connect(agent_url(asgi_server)) as ws:
        welcome = logged_in(ws, cast["server"])
    assert welcome["client"] == "web-00000" and welcome["model"] == "web-server"
    assert welcome["protocol"] == 1 and welcome["ref"] == "in"
    assert welcome["limits"]["max_frame_bytes"] == 65536


def test_an_agent_says_what_it_acts_on_at_login_and_the_console_keeps_it(asgi_server, cast):
    said = {"software": "sn-agent 0.2.0", "acts_on": "signed", "later": "ignored"}
    with connect(agent_url(asgi_server)) as ws:
        ws.send(json.dumps({"type": "login", "token": cast["server"], "agent": said}))
        welcome, _ = frames(ws, 2)
        wait_for(lambda: presence_of_server().acts_on == "signed", "the login was recorded")
    assert welcome["type"] == "welcome"
    assert presence_of_server().agent_software == "sn-agent 0.2.0"


@pytest.mark.parametrize(
    ("said", "field"),
    [
        ({"acts_on": "everything"}, "agent.acts_on"),
        ({"acts_on": True}, "agent.acts_on"),
        ({"software": "sn-agent\n0.2"}, "agent.software"),
        ({"software": "x" * 65}, "agent.software"),
        ("sn-agent", "agent"),
    ],
)
def test_a_login_saying_what_no_agent_says_of_itself_is_refused_naming_the_field(
    asgi_server, cast, said, field
):
    with connect(agent_url(asgi_server)) as ws:
        ws.send(json.dumps({"type": "login", "token": cast["server"], "agent": said}))
        error = json.loads(ws.recv(timeout=10))
        assert close_code(ws) == 4401
    assert (error["code"], error["field"]) == ("invalid", field)


def presence_of_server() -> AgentPresence:
    return AgentPresence.objects.filter(client__name="web-00000").first() or AgentPresence()


def test_agent_sockets_need_no_browser_origin_but_the_token_decides(asgi_server, cast):
    headers = {"Origin": "https://evil.example"}
    with connect(agent_url(asgi_server), additional_headers=headers) as ws:
        assert logged_in(ws, cast["server"])["client"] == "web-00000"


# Bad input after login: an error naming the field, and the connection stays -----------


@pytest.mark.parametrize(
    ("frame", "code", "field"),
    [
        ("{not json", "bad_frame", "frame"),
        ("[1, 2]", "bad_frame", "frame"),
        ('{"type": "dance"}', "bad_frame", "type"),
        ('{"type": "publish", "content": {"kind": "x"}}', "not_authorised", "sender"),
        ('{"type": "update", "values": {"region": "Northwest"}}', "not_authorised",
         "values.region"),
        ('{"type": "update", "values": {"load": "high"}}', "invalid", "values.load"),
        ('{"type": "advertise", "values": {"load": 0.5}}', "invalid", "values.cgi"),
        ('{"type": "ack", "delivery": 999999, "status": "ok"}', "not_found", "delivery"),
        ('{"type": "ack", "delivery": 1, "status": "maybe"}', "invalid", "status"),
        ('{"type": "ack", "delivery": 1, "status": "ok", "position": "x"}', "invalid",
         "position"),
        ('{"type": "login", "token": "again"}', "refused", "type"),
    ],
)  # fmt: skip
def test_bad_input_gets_an_error_naming_the_field_and_the_connection_survives(
    asgi_server, cast, frame, code, field
):
    assert_refused_and_alive(asgi_server, cast["server"], frame, code, field)


@pytest.mark.parametrize(
    ("frame", "code", "field"),
    [
        ('{"type": "publish"}', "invalid", "content"),
        ('{"type": "publish", "content": {"kind": "x"}, "lifetime_s": "soon"}', "invalid",
         "lifetime_s"),
        ('{"type": "publish", "content": {"kind": "x"}, "lifetime_s": true}', "invalid",
         "lifetime_s"),
        ('{"type": "publish", "content": {"sender.trust": 3}}', "not_authorised",
         "content.sender.trust"),
        ('{"type": "publish", "content": {"kind": "x"}, "selector": "receiver.load >"}',
         "policy_rejected", "selector"),
        ('{"type": "publish", "content": {"kind": "x"}, "channel": "no spaces"}', "invalid",
         "channel"),
    ],
)  # fmt: skip
def test_a_bad_publish_names_the_field_and_the_connection_survives(
    asgi_server, cast, frame, code, field
):
    assert_refused_and_alive(asgi_server, cast["controller"], frame, code, field)


DEEP = "[" * 20_000 + "]" * 20_000


@pytest.mark.parametrize(
    ("frame", "code", "field"),
    [
        ('{"type": []}', "bad_frame", "type"),
        ('{"type": {"a": 1}}', "bad_frame", "type"),
        (r'{"type": "update", "values": {"hostname": "web\u0000"}}', "invalid",
         "values.hostname"),
        (r'{"type": "update", "values": {"hostname": "web\ud800"}}', "invalid",
         "values.hostname"),
        (r'{"type": "update", "values": {"host\u0000name": "web"}}', "invalid",
         r"values.host\u0000name"),
        (r'{"type": "policy", "text": "accept event.kind == \"\u0000\""}', "invalid", "text"),
        (r'{"type": "policy", "text": "accept \udc00"}', "invalid", "text"),
        ('{"type": "update", "values": {"load": NaN}}', "invalid", "values.load"),
        ('{"type": "update", "values": {"load": Infinity}}', "invalid", "values.load"),
        ('{"type": "update", "values": {"load": -1e999}}', "invalid", "values.load"),
        ('{"type": "ack", "delivery": 99999999999999999999, "status": "ok"}', "invalid",
         "delivery"),
        (r'{"type": "ack", "delivery": 1, "status": "ok", "result": {"out": "\u0000"}}',
         "invalid", "result.out"),
        (r'{"type": "heartbeat", "ref": "\u0000"}', "invalid", "ref"),
        ('{"type": "update", "values": ' + DEEP + "}", "bad_frame", "frame"),
    ],
)  # fmt: skip
def test_malformed_json_and_unstorable_text_get_an_error_naming_the_field_and_no_1011(
    asgi_server, cast, frame, code, field
):
    assert_refused_and_alive(asgi_server, cast["server"], frame, code, field)


@pytest.mark.parametrize(
    ("frame", "field"),
    [
        (r'{"type": "publish", "content": {"kind": "x"}, "selector": "\u0000"}', "selector"),
        (r'{"type": "publish", "content": {"kind": "x"}, "channel": "a\u0000"}', "channel"),
        ('{"type": "publish", "content": {"kind": "x"}, "channel": "abc\\n"}', "channel"),
        (r'{"type": "publish", "content": {"kind": "\ud83d"}}', "content.kind"),
        ('{"type": "publish", "content": {"kind\\n": "x"}}', "content.kind\n"),
        ('{"type": "publish", "content": {"kind": "x"}, "lifetime_s": 1e400}', "lifetime_s"),
    ],
)  # fmt: skip
def test_a_publish_with_unstorable_text_or_a_partial_name_is_invalid_naming_the_field(
    asgi_server, cast, frame, field
):
    assert_refused_and_alive(asgi_server, cast["controller"], frame, "invalid", field)


@pytest.mark.parametrize(
    ("frame", "code", "field"),
    [
        (r'{"type": "login", "token": "snt_\ud800"}', "invalid", "token"),
        (r'{"type": "login", "token": "snt_\u0000"}', "invalid", "token"),
        ('{"type": []}', "bad_frame", "type"),
        ('{"type": "login", "token": ' + DEEP + "}", "bad_frame", "frame"),
    ],
)  # fmt: skip
def test_malformed_input_before_login_gets_an_error_and_the_unauthenticated_close(
    asgi_server, cast, frame, code, field
):
    with connect(agent_url(asgi_server)) as ws:
        ws.send(frame)
        error = json.loads(ws.recv(timeout=10))
        assert close_code(ws) == 4401
    assert (error["type"], error["code"], error["field"]) == ("error", code, field)


def assert_refused_and_alive(asgi_server, token, frame, code, field):
    with connect(agent_url(asgi_server)) as ws:
        logged_in(ws, token)
        ws.send(frame)
        error = json.loads(ws.recv(timeout=10))
        ws.send(json.dumps({"type": "heartbeat", "ref": "alive"}))
        alive = json.loads(ws.recv(timeout=10))
    assert (error["type"], error["code"], error["field"]) == ("error", code, field)
    assert alive["type"] == "heartbeat" and alive["ref"] == "alive"


def test_a_refusal_whose_audit_write_fails_still_gets_its_error_frame(asgi_server, cast):
    frame = json.dumps({"type": "update", "values": {"region": "Northwest"}})
    with inserts_refused("broker_auditentry", "NEW.outcome = 'refused'"):
        assert_refused_and_alive(asgi_server, cast["server"], frame, "not_authorised",
                                 "values.region")  # fmt: skip
    assert not AuditEntry.objects.filter(outcome="refused").exists()


def test_a_server_failure_on_a_frame_is_answered_as_internal_and_the_session_goes_on(
    asgi_server, cast
):
    # The last line of defence, reached through a real database failure: no client
    # input reaches it (the fuzzer checks that), but a bug or an outage would.
    frame = json.dumps({"type": "policy", "text": 'accept sender.scope == "national"'})
    with inserts_refused("broker_policyversion"):
        assert_refused_and_alive(asgi_server, cast["server"], frame, "internal", None)


def test_a_policy_that_does_not_parse_is_refused_with_its_position(asgi_server, cast):
    with connect(agent_url(asgi_server)) as ws:
        logged_in(ws, cast["server"])
        ws.send(json.dumps({"type": "policy", "text": "accept event.kind ==", "ref": 3}))
        error = json.loads(ws.recv(timeout=10))
    assert error["code"] == "policy_rejected" and error["ref"] == 3
    assert (error["line"], error["column"]) == (1, 21)


ILL_TYPED_FRAMES = {
    "selector: text for a float": (
        "controller", {"type": "publish", "content": COMMAND, "selector": 'load >= "high"'},
        (1, 9), "expected a number for 'load' (float), found \"high\"",
    ),
    "selector: text for a bool": (
        "controller", {"type": "publish", "content": COMMAND, "selector": 'cgi == "yes"'},
        (1, 8), "expected true or false for 'cgi' (bool)",
    ),
    "selector: misspelt name": (
        "controller", {"type": "publish", "content": COMMAND, "selector": "lod > 1"},
        (1, 1), "did you mean 'load'?",
    ),
    "policy: quoted trust": (
        "server", {"type": "policy", "text": 'accept sender.trust >= "2"'},
        (1, 24), "expected a whole number for 'sender.trust' (int)",
    ),
    "policy: quoted threat level": (
        "server", {"type": "policy", "text": 'accept event.threat_level >= "4"'},
        (1, 30), "expected a whole number for 'event.threat_level' (int)",
    ),
    "policy: undeclared event attribute": (
        "server", {"type": "policy", "text": "accept event.x == 1"},
        (1, 8), "unknown attribute 'event.x'",
    ),
}  # fmt: skip


@pytest.mark.parametrize(
    ("who", "frame", "position", "reason"), ILL_TYPED_FRAMES.values(), ids=ILL_TYPED_FRAMES
)
def test_an_ill_typed_text_is_refused_with_position_and_expected_type(
    asgi_server, cast, who, frame, position, reason
):
    with connect(agent_url(asgi_server)) as ws:
        logged_in(ws, cast[who])
        ws.send(json.dumps({**frame, "ref": "typed"}))
        error = json.loads(ws.recv(timeout=10))
    assert (error["code"], error["ref"]) == ("policy_rejected", "typed")
    assert (error["line"], error["column"]) == position
    assert reason in error["message"]


def test_a_claimed_attribute_is_refused_in_the_audit_log_and_nothing_is_applied(asgi_server, cast):
    with connect(agent_url(asgi_server)) as ws:
        logged_in(ws, cast["server"])
        ws.send(json.dumps({"type": "update", "values": {"load": 0.99, "region": "Northwest"}}))
        error = json.loads(ws.recv(timeout=10))
    assert (error["code"], error["field"]) == ("not_authorised", "values.region")
    refusal = AuditEntry.objects.get(action="attributes.state", outcome="refused")
    assert refusal.actor == "client:web-00000"
    assert cast["server_client"].attribute_values.get(name="load").value != 0.99


def test_an_oversized_frame_is_refused_and_the_connection_survives(asgi_server, cast):
    with connect(agent_url(asgi_server), max_size=None) as ws:
        logged_in(ws, cast["server"])
        ws.send(json.dumps({"type": "heartbeat", "padding": "x" * 70_000}))
        error = json.loads(ws.recv(timeout=10))
        ws.send(json.dumps({"type": "heartbeat"}))
        assert json.loads(ws.recv(timeout=10))["type"] == "heartbeat"
    assert (error["code"], error["field"]) == ("frame_too_large", "frame")


def test_a_frame_beyond_what_the_server_reads_closes_the_socket_as_too_big(asgi_server, cast):
    # Past WEB_MAX_MESSAGE_BYTES the web server does not read the frame at all: 1009
    # (message too big), never 1011, and nothing is half done.
    with connect(agent_url(asgi_server), max_size=None) as ws:
        logged_in(ws, cast["server"])
        ws.send(json.dumps({"type": "heartbeat", "padding": "x" * WEB_MAX_MESSAGE_BYTES}))
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=10)
    assert closed.value.rcvd.code == 1009


def test_a_flood_is_rate_limited_and_then_disconnected_as_abusive(asgi_server, cast):
    with connect(agent_url(asgi_server)) as ws:
        logged_in(ws, cast["server"])
        for _ in range(600):
            ws.send('{"type": "heartbeat"}')
        replies = []
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                replies.append(json.loads(ws.recv(timeout=10)))
    limited = [r for r in replies if r.get("code") == "rate_limited"]
    assert limited and len([r for r in replies if r["type"] == "heartbeat"]) >= 200
    assert closed.value.rcvd.code == 4429


# The whole flow, through the tree ------------------------------------------------------


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, timeout=60))


async def next_notification(agent: Agent):
    return await anext(aiter(agent.notifications()))


async def a_command_received(receiver: Agent, controller: Agent):
    """The IIS command, published by `controller`, as `receiver` is notified of it."""
    await controller.publish(COMMAND, selector=IIS_SELECTOR)
    return await next_notification(receiver)


def answer_to(notification) -> dict:
    return {"type": "ack", "delivery": notification.delivery, "status": "ok"}


def test_advertise_policy_publish_receive_and_ack_through_the_tree(asgi_server, cast):
    url = agent_url(asgi_server)

    async def flow():
        async with Agent(url, cast["server"]) as server, Agent(url, cast["controller"]) as ctl:
            await server.advertise(
                {"hostname": "web-00000", "software": "IIS", "version": "2.4.1", "cgi": True,
                 "load": 0.2}
            )  # fmt: skip
            version = await server.set_policy('accept sender.scope == "national"')
            published = await ctl.publish(COMMAND, selector=IIS_SELECTOR, lifetime_s=120)
            notification = await next_notification(server)
            await server.ack(notification.delivery, "ok", {"exit_code": 0, "output": "done"})
            return version, published, notification

    version, published, notification = run(flow())
    assert version == 2  # the scenario set version 1
    assert notification.event == published["event"] and notification.content == COMMAND
    assert notification.replay is False
    delivery = Delivery.objects.get(pk=notification.delivery)
    assert delivery.state == "acked" and delivery.result == {"exit_code": 0, "output": "done"}
    assert AuditEntry.objects.filter(action="delivery.ack", outcome="done").exists()


def test_an_answer_that_gives_a_position_also_confirms_receipt(asgi_server, cast):
    url = agent_url(asgi_server)

    async def flow():
        async with Agent(url, cast["server"]) as server, Agent(url, cast["controller"]) as ctl:
            notification = await a_command_received(server, ctl)
            answer = await server.request(
                {**answer_to(notification), "position": notification.position}
            )
            return notification, answer

    notification, answer = run(flow())
    assert answer["confirmed_position"] == notification.position == answer["last_position"]
    delivery = Delivery.objects.get(pk=notification.delivery)
    assert delivery.state == "acked" and delivery.receiver.stream.confirmed_position == 1


def test_an_answer_confirming_beyond_the_stream_is_recorded_and_the_confirmation_refused(
    asgi_server, cast
):
    url = agent_url(asgi_server)

    async def flow():
        async with Agent(url, cast["server"]) as server, Agent(url, cast["controller"]) as ctl:
            notification = await a_command_received(server, ctl)
            with pytest.raises(AgentError) as refused:
                await server.request({**answer_to(notification), "position": 99})
            alive = await server.heartbeat()
            return notification, refused.value, alive

    notification, refused, alive = run(flow())
    assert refused.code == "invalid" and refused.field == "position" and "beyond" in str(refused)
    assert Delivery.objects.get(pk=notification.delivery).state == "acked"
    assert alive["type"] == "heartbeat"


def test_acknowledging_twice_is_harmless_but_changing_the_answer_is_refused(asgi_server, cast):
    url = agent_url(asgi_server)

    async def flow():
        async with Agent(url, cast["server"]) as server, Agent(url, cast["controller"]) as ctl:
            notification = await a_command_received(server, ctl)
            await server.ack(notification.delivery, "failed", {"exit_code": 3})
            await server.ack(notification.delivery, "failed", {"exit_code": 3})
            with pytest.raises(AgentError) as refused:
                await server.ack(notification.delivery, "ok")
            return refused.value

    refused = run(flow())
    assert refused.code == "invalid" and refused.field == "delivery"


def test_two_sessions_of_one_client_both_get_the_push_and_the_first_answer_stands(
    asgi_server, cast
):
    url = agent_url(asgi_server)

    async def flow():
        async with (
            Agent(url, cast["server"]) as first,
            Agent(url, cast["server"]) as second,
            Agent(url, cast["controller"]) as ctl,
        ):
            await ctl.publish(COMMAND, selector=IIS_SELECTOR)
            got = [await next_notification(first), await next_notification(second)]
            await first.ack(got[0].delivery, "ok", {"exit_code": 0})
            with pytest.raises(AgentError) as refused:
                await second.ack(got[1].delivery, "failed", {"exit_code": 1})
            return got, refused.value

    got, refused = run(flow())
    assert got[0].delivery == got[1].delivery
    assert refused.code == "invalid" and "already answered (acked)" in refused.message
    assert Delivery.objects.get(pk=got[0].delivery).result == {"exit_code": 0}


def test_a_receiver_that_was_offline_gets_what_it_missed_once_in_order_then_live(asgi_server, cast):
    url = agent_url(asgi_server)

    async def flow():
        server = Agent(url, cast["server"])
        async with Agent(url, cast["controller"]) as ctl:
            await server.connect()
            await ctl.publish({**COMMAND, "n": 0}, selector=IIS_SELECTOR, channel="ops")
            first = await next_notification(server)
            await server.close()
            for n in (1, 2, 3):
                await ctl.publish({**COMMAND, "n": n}, selector=IIS_SELECTOR, channel="ops")
            await in_thread(wait_until_idle)()
            await server.connect()  # logs in with the last delivery it saw
            missed = [await next_notification(server) for _ in range(3)]
            await server.replayed.wait()
            await ctl.publish({**COMMAND, "n": 4}, selector=IIS_SELECTOR, channel="ops")
            live = await next_notification(server)
            await server.close()
            return first, missed, live, server

    first, missed, live, server = run(flow())
    assert [n.content["n"] for n in missed] == [1, 2, 3]
    assert [n.sequence for n in missed] == [2, 3, 4] and all(n.replay for n in missed)
    assert live.content["n"] == 4 and not live.replay
    assert server._ready.empty()  # nothing twice
    assert first.content["n"] == 0


def test_without_a_cursor_a_reconnecting_agent_gets_every_unanswered_delivery(asgi_server, cast):
    url = agent_url(asgi_server)

    async def flow():
        async with Agent(url, cast["controller"]) as ctl:
            for n in (1, 2):
                await ctl.publish({**COMMAND, "n": n}, selector=IIS_SELECTOR)
        await in_thread(wait_until_idle)()
        async with Agent(url, cast["server"]) as server:
            replayed = [await next_notification(server) for _ in range(2)]
            await server.ack(replayed[0].delivery)
        async with Agent(url, cast["server"]) as again:
            await again.replayed.wait()
            return [n.content["n"] for n in replayed], [await next_notification(again)]

    first_time, second_time = run(flow())
    assert first_time == [1, 2]
    assert [n.content["n"] for n in second_time] == [2]


def test_revoking_the_tokens_ends_the_live_session(asgi_server, cast):
    url = agent_url(asgi_server)

    async def flow():
        async with Agent(url, cast["server"]) as server:
            await in_thread(revoke_tokens)(client=cast["server_client"], actor=ISSUER)
            with pytest.raises(SessionEnded) as ended:
                await next_notification(server)
            return ended.value

    assert run(flow()).code == 4403


def test_a_revocation_whose_notice_was_lost_ends_the_session_at_the_next_heartbeat(
    asgi_server, cast
):
    url = agent_url(asgi_server)

    async def flow():
        async with Agent(url, cast["server"]) as server:
            # Revoked as when Redis was down at that moment: no notice reaches the socket.
            await in_thread(_revoke_silently)(cast["server_client"])
            with pytest.raises(SessionEnded) as ended:
                await next_notification(server)
            return ended.value

    assert run(flow()).code == 4403


def _revoke_silently(client) -> None:
    from django.utils import timezone

    client.tokens.update(revoked_at=timezone.now())


def test_a_consumer_receives_only_its_own_clients_deliveries(asgi_server, cast):
    url = agent_url(asgi_server)
    apache = next(s for s in cast["scenario"].servers if s.name == "web-00001")
    other = issue_token(client=apache, actor=ISSUER)

    async def flow():
        async with (
            Agent(url, cast["server"]) as iis,
            Agent(url, other) as not_iis,
            Agent(url, cast["controller"]) as ctl,
        ):
            got = await a_command_received(iis, ctl)
            await in_thread(wait_until_idle)()
            await asyncio.sleep(0.5)
            return got, not_iis._ready.qsize()

    got, elsewhere = run(flow())
    assert got.content == COMMAND and elsewhere == 0


def test_a_session_gets_live_pushes_again_after_redis_forgot_its_group(asgi_server, cast):
    # As when Redis restarts with nothing on disk: the group and the process's mark go.
    url, server = agent_url(asgi_server), Client.objects.get(name="web-00000")
    redis = Redis.from_url(settings.CHANNEL_LAYER_URL)
    group_key = f"{get_channel_layer().prefix}:group:{client_group(server.pk)}"

    def forget() -> None:
        redis.delete(group_key, *redis.scan_iter(f"{get_channel_layer().prefix}:process:*"))

    async def flow():
        async with Agent(url, cast["server"]) as iis, Agent(url, cast["controller"]) as ctl:
            await in_thread(forget)()
            await in_thread(wait_for)(lambda: redis.exists(group_key), "joined again", 15)
            return await a_command_received(iis, ctl)

    got = run(flow())
    assert got.content == COMMAND and got.replay is False


def test_heartbeat_answers_with_the_server_time(asgi_server, cast):
    with connect(agent_url(asgi_server)) as ws:
        logged_in(ws, cast["server"])
        ws.send('{"type": "heartbeat", "ref": "hb"}')
        reply = json.loads(ws.recv(timeout=10))
    assert reply["ref"] == "hb" and reply["server_time"].startswith(time.strftime("%Y-"))


def test_an_idle_session_outlives_the_channel_layers_blocking_read(asgi_server, cast):
    # The layer blocks 5 s per read on an idle channel; a Redis client timing out at
    # the same moment used to kill every idle agent's consumer. The agent heartbeats as
    # asked (every AGENT_HEARTBEAT_S, 2 s here: silent for 3 of them, it is closed).
    with connect(agent_url(asgi_server)) as ws:
        logged_in(ws, cast["server"])
        for beat in range(4):  # 6.8 s with nothing on its channel
            time.sleep(1.7)
            ws.send(json.dumps({"type": "heartbeat", "ref": beat}))
            assert json.loads(ws.recv(timeout=10))["ref"] == beat


def test_the_health_check_answers_while_agents_are_listening(asgi_server, cast):
    # A connected consumer holds the process's channel-layer receive; the health
    # check's own channel must still get its echo (it used to wait forever).
    with connect(agent_url(asgi_server)) as ws:
        logged_in(ws, cast["server"])
        with urllib.request.urlopen(asgi_server + "/healthz.json", timeout=20) as response:
            health = json.loads(response.read())
    layer = next(c for c in health["checks"] if c["name"] == "channel layer")
    assert layer["ok"], layer


def test_a_sender_signs_its_publish_and_the_receiver_is_handed_the_seal(asgi_server, cast):
    own_key = new_private_key()  # the controller's, kept on its own host
    set_signing_key(client=cast["controller_client"],
                    public_key=public_key_text(own_key.public_key()), actor=ISSUER)  # fmt: skip
    url = agent_url(asgi_server)

    async def flow():
        async with Agent(url, cast["server"]) as server, Agent(url, cast["controller"]) as ctl:
            published = await ctl.publish(COMMAND, selector=IIS_SELECTOR, signing_key=own_key)
            return published, await next_notification(server)

    published, notification = run(flow())
    assert notification.event == published["event"]
    assert notification.seal["sender"] == "intellimune-national"
    assert notification.seal["key"] == public_key_text(own_key.public_key())
    assert (
        Event.objects.get(pk=published["event"]).seal["signature"] == notification.seal["signature"]
    )
