"""The light fleet of the scale benchmarks: the agent protocol and nothing more, but
all of it: in stream order, repeats dropped, gaps asked for again, every notification
answered in the frame that confirms it, commands obeyed as the real fleet's are."""

from __future__ import annotations

import asyncio
import random

import orjson
import pytest

from broker.reads.clients import current_attributes
from broker.services.events import publish_event
from demo.light_fleet import LightServer, retry_after_s
from demo.light_socket import Refused
from tests.broker.agent_helpers import wait_for
from tests.demo.fleets import answered, running_fleet

IIS = 'receiver.software == "IIS"'
VALUES = {"hostname": "web-x", "software": "IIS", "version": "2.4.1", "cgi": True, "load": 0.3}


class Socket:
    """What the server was sent."""

    def __init__(self) -> None:
        self.sent: list[dict] = []

    def send(self, text: str) -> None:
        self.sent.append(orjson.loads(text))


def notification(position: int, content: dict | None = None) -> dict:
    return {"type": "notification", "delivery": 100 + position, "position": position,
            "event": f"e{position}", "sender": 1, "channel": "ops", "sequence": position,
            "content": content or {"kind": "alert"}, "replay": False}  # fmt: skip


def take(*frames: dict, wait_s: float = 0.0) -> tuple[LightServer, list[dict]]:
    """A server logged in after position 3, handed `frames`: it and what it sent."""

    async def scene():
        server = LightServer({"token": "t", "values": VALUES}, url="ws://unused",
                             load_interval_s=3600, rng=random.Random(0))  # fmt: skip
        server.socket, server.position = Socket(), 3
        for frame in frames:
            server._take(frame)
        await asyncio.sleep(wait_s or 0.01)
        sent = server.socket.sent
        for task in list(server.tasks):
            task.cancel()
        return server, sent

    return asyncio.run(scene())


def acks(sent: list[dict]) -> list[tuple[int, int]]:
    return [(f["delivery"], f["position"]) for f in sent if f["type"] == "ack"]


def test_notifications_are_answered_in_stream_order_each_in_the_frame_that_confirms_it():
    server, sent = take(notification(5), notification(4), notification(6))
    assert acks(sent) == [(104, 4), (105, 5), (106, 6)]
    assert server.position == 6
    assert server.unanswered.keys() == {104, 105, 106}  # kept until the server has them


def test_repeats_are_dropped_and_counted():
    server, sent = take(notification(3), notification(4), notification(4))
    assert acks(sent) == [(104, 4)] and server.duplicates == 2


def test_a_gap_is_held_and_asked_for_again_after_a_second():
    server, sent = take(notification(5), wait_s=1.2)
    assert acks(sent) == [] and server.held.keys() == {5}
    assert {"type": "resend", "ref": "resend", "after_position": 3} in sent


def test_a_replay_covers_the_gap_it_says_is_gone():
    server, sent = take(notification(6), {"type": "replayed", "through": 6})
    assert acks(sent) == [(106, 6)] and server.position == 6


def test_an_answer_refused_for_its_rate_is_sent_again():
    error = {"type": "error", "ref": "ack:104", "code": "rate_limited", "message": "slow"}
    _, sent = take(notification(4), error, wait_s=0.3)
    assert acks(sent) == [(104, 4), (104, 4)]


def test_commands_are_obeyed_as_the_real_fleets_web_server_ctl_does():
    disable = notification(4, {"kind": "command", "action": "disable-cgi"})
    status = notification(5, {"kind": "command", "action": "status"})
    unknown = notification(6, {"kind": "command", "action": "reboot"})
    _, sent = take(disable, status, unknown)
    answers = {f["delivery"]: (f["status"], f["result"]) for f in sent if f["type"] == "ack"}
    assert answers[104] == ("ok", {"exit_code": 0, "output": "web-x: CGI disabled"})
    assert orjson.loads(answers[105][1]["output"])["cgi"] is False
    assert answers[106] == ("failed", {"error": "web-x: unknown action reboot"})
    assert {"type": "update", "ref": "cgi", "values": {"cgi": False}} in sent


def test_a_busy_refusal_of_the_handshake_is_waited_out_as_it_asked():
    busy = orjson.dumps({"type": "error", "code": "busy", "retry_after_s": 2.5})
    assert retry_after_s(Refused(503, {"retry-after": "3"}, busy)) == 2.5
    assert retry_after_s(Refused(503, {"retry-after": "3"}, b"")) == 3.0
    assert retry_after_s(Refused(500, {}, b"")) == 0.0 and retry_after_s(OSError()) == 0.0


# Against a real console ---------------------------------------------------------------


@pytest.fixture
def light_fleet(asgi_server, celery_worker):
    """Six scenario web servers as the light fleet."""
    yield from running_fleet(asgi_server, light=True)


@pytest.mark.django_db(transaction=True)
def test_the_light_fleet_answers_an_alert_and_obeys_a_command_over_real_sockets(light_fleet):
    controllers = light_fleet.controllers
    alert = publish_event(sender=controllers["northwest-controller"],
                          content={"alert": "worm", "threat_level": 4})  # fmt: skip
    command = publish_event(sender=controllers["intellimune-national"],
                            content={"kind": "command", "action": "disable-cgi"},
                            selector=IIS)  # fmt: skip
    wait_for(lambda: answered(alert, 6) and answered(command, 2), "every server answered")
    assert {d.state for d in answered(alert, 6)} == {"acked"}
    cgi_off = answered(command, 2)
    assert {d.result["output"] for d in cgi_off} == {
        "web-00000: CGI disabled", "web-00003: CGI disabled"
    }  # fmt: skip
    wait_for(lambda: all(current_attributes(d.receiver)["cgi"] is False for d in cgi_off),
             "the servers told the console CGI is off")  # fmt: skip
    confirmed = {d.receiver.stream.confirmed_position >= d.position for d in cgi_off}
    assert confirmed == {True}
