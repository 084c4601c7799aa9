"""Fuzzing the agent socket of a real Uvicorn with malformed frames (Hypothesis).

Every field of every client frame gets wrong types, NUL, lone surrogates, NaN and
Infinity, huge numbers, odd Unicode and deep nesting, before and after login. Each
frame must get a well-formed answer, any error must carry a code that docs/protocol.md
documents (never `internal`, which only a server failure may cause), and the socket is
never closed with 1011: after login the session survives, before it the close is the
documented 4401. Derandomized and bounded, so that a run is reproducible and short.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st
from websockets.exceptions import ConnectionClosed
from websockets.protocol import State
from websockets.sync.client import connect

from broker.protocol import CLIENT_TYPES, MAX_FRAME_BYTES
from broker.services.clients import issue_token
from demo.scenario import load_scenario
from tests.broker.agent_helpers import ISSUER, agent_url
from tests.broker.tree_helpers import wait_until_idle

pytestmark = pytest.mark.django_db(transaction=True)

PROTOCOL_DOC = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"
ANSWERS = {"ok", "published", "heartbeat", "error"}
FRAME_INTERVAL_S = 0.025  # below the documented 50 frames per second
FUZZ = settings(
    max_examples=400,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)


def documented_error_codes() -> set[str]:
    """The codes of the error table in docs/protocol.md."""
    table = PROTOCOL_DOC.read_text().split("| code | meaning |", 1)[1].split("\n\n", 1)[0]
    return set(re.findall(r"^\| `([a-z_]+)` \|", table, flags=re.MULTILINE))


# What a client can put in a frame -------------------------------------------------------


def weighted(*choices: tuple[int, st.SearchStrategy]) -> st.SearchStrategy:
    """One of the strategies, drawn in proportion to its weight."""
    table = [strategy for weight, strategy in choices for _ in range(weight)]
    return st.integers(0, len(table) - 1).flatmap(table.__getitem__)


ODD_TEXT = st.sampled_from(
    ["", " ", "\x00", "a\x00b", "\ud800", "\udfff", "x\udc00y", "abc\n", "kind\n", "\u202e",
     "🚀", "\ufeff", "\uffff", "'", '"', "\\", "a.b", "sender.trust", "x" * 2000]
)  # fmt: skip
TEXT = st.text(st.characters(exclude_categories=[]), max_size=24) | ODD_TEXT
ODD_NUMBERS = st.sampled_from(
    [2**63, 2**63 - 1, -(2**63) - 1, 10**40, -1, 0, 0.5, -0.0, 1e308, float("nan"),
     float("inf"), float("-inf")]
)  # fmt: skip
NUMBERS = st.integers() | st.floats(allow_nan=True, allow_infinity=True) | ODD_NUMBERS
SCALARS = st.none() | st.booleans() | NUMBERS | TEXT
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=12,
)
ODD = ODD_TEXT | ODD_NUMBERS
POLICIES = st.sampled_from(
    ['accept sender.scope == "national"', "accept event.kind ==", "accept ((((", "accept",
     'accept event.kind in ["a", "b"] and not sender.trust < 2', "accept true"]
)  # fmt: skip
SELECTORS = st.sampled_from(
    ['receiver.software == "IIS"', "receiver.load >", "load < 0.5 and cgi", "((((", "",
     'software ~ "I*"', "receiver.nothing == 1"]
)  # fmt: skip
ATTRIBUTES = {
    "hostname": st.sampled_from(["web-00000", "x" * 1001]) | TEXT,
    "software": st.sampled_from(["IIS", "Apache"]),
    "version": st.sampled_from(["2.4.1", "x.y", "10.0"]),
    "cgi": st.booleans(),
    "load": st.floats(0, 1) | NUMBERS,
    "region": st.just("Northwest"),
}
ATTRIBUTE_VALUES = st.sampled_from(sorted(ATTRIBUTES)).flatmap(
    lambda name: st.tuples(st.just(name), ATTRIBUTES[name])
)
CONTENT_NAMES = weighted(
    (9, st.sampled_from(["kind", "action", "n"])),
    (1, st.sampled_from(["sender", "sender.trust", "kind\n", "", "1x"])),
)
PLAUSIBLE = {
    "token": st.just("snt_not-a-token"),
    "after": st.integers(-5, 10**6),
    "values": st.lists(ATTRIBUTE_VALUES, min_size=1, max_size=5).map(dict),
    "text": POLICIES,
    "content": st.dictionaries(CONTENT_NAMES, TEXT | st.integers(), min_size=1, max_size=4),
    "selector": SELECTORS,
    "lifetime_s": st.integers(-5, 700_000),  # 1..604800 is valid
    "channel": weighted(
        (4, st.sampled_from(["default", "ops", "a/b:c"])),
        (1, st.sampled_from(["abc\n", "no spaces", "x" * 129, ""])),
    ),
    "delivery": st.integers(-5, 10**6),
    "status": st.sampled_from(["ok", "failed", "maybe"]),
    "result": st.dictionaries(st.sampled_from(["exit_code", "output"]), SCALARS, max_size=2),
}
FIELDS = {
    "login": ["token", "after"],
    "advertise": ["values"],
    "update": ["values"],
    "policy": ["text"],
    "publish": ["content", "selector", "lifetime_s", "channel"],
    "ack": ["delivery", "status", "result"],
    "heartbeat": [],
}
ABSENT = object()


def field_value(name: str) -> st.SearchStrategy:
    """Mostly a plausible value of the field, else something odd, anything, or nothing."""
    return weighted(
        (12, PLAUSIBLE[name]),
        (2, ODD),
        (1, VALUES),
        (1, st.just(ABSENT)),
    )


@st.composite
def structured_frames(draw) -> str:
    """A frame of a known (or odd) type with plausible, odd or wrong fields."""
    kind = draw(weighted((9, st.sampled_from(sorted(CLIENT_TYPES))), (1, VALUES)))
    frame = {"type": kind}
    for name in FIELDS.get(kind, []) if isinstance(kind, str) else []:
        value = draw(field_value(name))
        if value is not ABSENT:
            frame[name] = value
    if draw(weighted((9, st.just(False)), (1, st.just(True)))):
        frame[draw(TEXT)] = draw(VALUES)  # an unknown field, to be ignored if well-formed
    frame["ref"] = draw(weighted((9, st.just("fuzz")), (1, VALUES)))
    return json.dumps(frame, allow_nan=True)  # NaN, Infinity and surrogates as escapes


def nested(depth: int) -> str:
    return '{"type": "update", "values": {"load": ' + "[" * depth + "]" * depth + "}}"


ODD_FRAMES = [
    '{"type": "heartbeat", "ref": 1, "ref": NaN}', '{"type": "update", "values": 1e999}',
    '{"type": "ack", "delivery": 1' + "0" * 5000 + "}", "[]", "null", '"heartbeat"',
    '{"type": "heartbeat"} trailing', "{\"type\": 'single'}",
]  # fmt: skip
RAW_FRAMES = (
    st.integers(min_value=30, max_value=20_000).map(nested)
    | st.text(st.characters(exclude_categories=["Cs"]), max_size=64)
    | st.sampled_from(ODD_FRAMES)
    | st.binary(max_size=32)
)
FRAMES = weighted((8, structured_frames()), (2, RAW_FRAMES))


# Checking the answers -------------------------------------------------------------------


class Session:
    """A logged-in socket, paced below the rate limit, that reads past notifications.
    A closed socket fails the frame that closed it, and the next frame reconnects, so
    that one failure does not fail every later example."""

    def __init__(self, url: str, token: str) -> None:
        self.url, self.token = url, token
        self.socket = None
        self.sent_at = 0.0

    def ask(self, frame: str | bytes) -> dict:
        if self.socket is None or self.socket.state is not State.OPEN:
            self._log_in()
        time.sleep(max(0.0, self.sent_at + FRAME_INTERVAL_S - time.monotonic()))
        self.sent_at = time.monotonic()
        self.socket.send(frame)
        return self.answer()

    def answer(self) -> dict:
        while True:
            reply = json.loads(self.socket.recv(timeout=20))
            if reply.get("type") != "notification":
                return reply

    def close(self) -> None:
        if self.socket is not None:
            self.socket.close()

    def _log_in(self) -> None:
        self.close()
        self.socket = connect(self.url, max_size=None, legacy=True)
        self.socket.send(json.dumps({"type": "login", "token": self.token}))
        assert self.answer()["type"] == "welcome" and self.answer()["type"] == "replayed"


def assert_well_formed(reply: dict, codes: set[str]) -> None:
    assert reply.get("type") in ANSWERS, reply
    if reply["type"] == "error":
        assert reply["code"] in codes - {"internal"}, reply
        assert isinstance(reply["message"], str) and reply["message"], reply
        assert reply["field"] is None or isinstance(reply["field"], str), reply


@pytest.fixture
def tokens(celery_worker):
    """Tokens of a web server (a receiver) and a controller (a sender)."""
    scenario = load_scenario(servers=2)
    wait_until_idle()
    server = next(s for s in scenario.servers if s.name == "web-00000")
    controller = scenario.controllers["intellimune-national"]
    return [issue_token(client=c, actor=ISSUER) for c in (server, controller)]


def test_every_frame_after_login_gets_a_documented_answer_and_the_session_survives(
    asgi_server, tokens
):
    codes = documented_error_codes()
    sessions = [Session(agent_url(asgi_server), token) for token in tokens]

    @FUZZ
    @given(who=st.sampled_from([0, 1]), frame=FRAMES)
    def one_frame(who: int, frame: str | bytes) -> None:
        if len(frame) > MAX_FRAME_BYTES:
            return
        note(f"frame: {frame[:500]!r}")
        assert_well_formed(sessions[who].ask(frame), codes)

    try:
        one_frame()
        for session in sessions:  # and both sessions still answer
            assert session.ask('{"type": "heartbeat", "ref": "end"}')["ref"] == "end"
    finally:
        for session in sessions:
            session.close()
    wait_until_idle()


def test_every_frame_before_login_gets_an_error_and_the_unauthenticated_close(asgi_server, tokens):
    codes = documented_error_codes()

    @settings(FUZZ, max_examples=100)
    @given(frame=FRAMES)
    def one_frame(frame: str | bytes) -> None:
        note(f"frame: {frame[:500]!r}")
        with connect(agent_url(asgi_server), max_size=None) as ws:
            ws.send(frame)
            reply = json.loads(ws.recv(timeout=20))
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=20)
        assert reply["type"] == "error", reply
        assert_well_formed(reply, codes)
        assert closed.value.rcvd.code in {4401, 4429}, (closed.value.rcvd, reply)

    one_frame()
