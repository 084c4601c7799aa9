"""The agent protocol's frames and limits (docs/protocol.md), without any I/O: the
rules a web process keeps for all its sessions (the login gate; the watch on sessions
gone silent, which closes them through its caller) keep time but read and write
nothing.

A frame is one JSON object in one WebSocket text message. Client frames carry a `type`
and may carry a `ref` that the answer repeats, so that an agent can match answers to
requests. Every refusal is an `error` frame naming the offending field.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import re
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from sn_agent.client import ACTS_ON

from broker.errors import BrokerError, InvalidInput
from broker.inputs import decode_json, printable_text

logger = logging.getLogger(__name__)

PROTOCOL_VERSION = 1
MAX_FRAME_BYTES = 64 * 1024
REPLAY_PAGE = 500

# Flood control: a token bucket per connection. Frames beyond it are refused with an
# error; a client that keeps flooding is disconnected as abusive.
RATE_PER_S = 50.0
BURST = 200
ABUSE_LIMIT = 100  # refused frames (too fast or too large) before the connection is closed

CLOSE_UNAUTHENTICATED = 4401
CLOSE_LOGIN_TIMEOUT = 4408
CLOSE_ABUSIVE = 4429
CLOSE_REVOKED = 4403
# Nothing heard from the agent for 3 heartbeats (broker.protocol.SilenceWatch): its peer is gone.
CLOSE_SILENT = 4410
# The server could not serve a login now (its database or Redis is down): WebSocket's
# own "Try Again Later". (Releases before closed with 4503; agents treat both alike.)
CLOSE_TRY_AGAIN_LATER = 1013
# Busy with other logins, told after the handshake: only under a web server that can
# neither refuse the handshake (503) nor send 1013 (Daphne).
CLOSE_BUSY = 4503

CLIENT_TYPES = frozenset(
    {"login", "advertise", "update", "policy", "publish", "ack", "heartbeat", "received", "resend"}
)


class FrameError(BrokerError):
    """A frame that is not a well-formed request of this protocol."""

    code = "bad_frame"


class TooLarge(BrokerError):
    code = "frame_too_large"


class RateLimited(BrokerError):
    code = "rate_limited"


class InternalError(BrokerError):
    """The server failed on a frame (a bug, or the database is down); no client input
    should ever cause this, and the session goes on."""

    code = "internal"


class Busy(BrokerError):
    """Too many agents logging in at once in this web process: the agent is told when
    to come back (`retry_after_s`) at once, instead of waiting until its login times
    out."""

    code = "busy"

    def __init__(self, retry_after_s: float) -> None:
        super().__init__(
            f"this console is logging in many agents at once: try again in {retry_after_s:g} s"
        )
        self.retry_after_s = retry_after_s

    def as_dict(self) -> dict:
        return {**super().as_dict(), "retry_after_s": self.retry_after_s}


@dataclass(frozen=True)
class LoginTicket:
    """A connection let in to log in: when, and the gate's count of waiting-seconds
    then (LoginGate.waited_s)."""

    arrived_at: float
    waited_s: float


class LoginGate:
    """At most `limit` connections of one process waiting to be logged in (connected,
    login not yet done), and fewer when logins finish so slowly that the last of them
    would wait past `patience_s`. Beyond it a connection is refused at once with a time to
    come back: a slot of its own, after those waiting and those refused before it, one
    every so often at the rate the process logs agents in, so that a fleet that comes
    back at once (after an outage) is logged in as fast as the process can, each agent
    refused about once, and no agent waits on a crowded process until its login times
    out.

    The rate is what recent logins saw: how many were waiting on average while each
    waited, over how long each took (Little's law), summed over the last RATE_SAMPLE.
    Counting the logins that finished per second instead measured the crowd as much as
    the console: a crowd let in at once finishes late and together, so its first second
    counted ten logins where the next half counted four hundred, and a lull while the
    refused were away looked like a slow console; the refused were then sent away for
    longer, and 5,000 agents took anything from 19 to 53 s to log in from one run to
    the next."""

    RATE_SAMPLE = 200  # the logins whose waits give the rate
    # Logins a second, until RATE_MEASURED_FROM have finished: a web process on two
    # cores logs in some 900 a second, its waiting logins run together
    # (docs/benchmarks.md). Assumed lower, a process that had just started refused
    # most of a fleet coming back to it, and booked them seconds away.
    ASSUMED_RATE = 1000.0
    RATE_MEASURED_FROM = 10
    SHORTEST_WAIT_S = 1.0  # a refused agent is not asked back sooner
    LONGEST_WAIT_S = 60.0
    # Slots are booked this much faster than logins have been finishing. At the very
    # rate, a crowd never came back faster than it was being logged in, so the rate
    # never rose to what the console could do: 10,000 agents took 83 s to log in,
    # where agents that ignored the wait and came back at once took 51 s.
    PACE = 1.5

    def __init__(
        self,
        limit: int,
        *,
        patience_s: float = 5.0,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limit = limit
        # How long the last one admitted may expect to wait (half the login time-out).
        self.patience_s = patience_s
        self.waiting = 0
        self.clock = clock
        self.ticked_at = clock()
        self.waited_s = 0.0  # the seconds every connection has waited, in all
        # (how many waited on average alongside, seconds taken) of the recent logins,
        # and their sums.
        self.finished: deque[tuple[float, float]] = deque()
        self.in_line_sum, self.taken_sum = 0.0, 0.0
        self.booked_until = 0.0  # the last refused agent's slot (on `clock`)
        self.rng = rng or random.Random()

    def arrive(self) -> LoginTicket:
        """A connection that will log in: raises Busy when as many are waiting as can
        be logged in within `patience_s` at the rate the process logs in, or `limit`.
        The ticket is given back to `leave`."""
        now = self._tick()
        room = min(self.limit, max(1, int(self._rate() * self.patience_s)))
        if self.waiting >= room:
            raise Busy(self._retry_after(now))
        self.waiting += 1
        return LoginTicket(now, self.waited_s)

    def leave(self, ticket: LoginTicket, *, logged_in: bool) -> None:
        """An arrived connection logged in, or went away without."""
        now = self._tick()
        self.waiting -= 1
        if logged_in and now > ticket.arrived_at:
            taken_s = now - ticket.arrived_at
            in_line = max(1.0, (self.waited_s - ticket.waited_s) / taken_s)
            self._count(in_line, taken_s)

    def _tick(self) -> float:
        """Add the seconds waited since the last arrival or departure."""
        now = self.clock()
        self.waited_s += self.waiting * (now - self.ticked_at)
        self.ticked_at = now
        return now

    def _count(self, in_line: float, taken_s: float) -> None:
        self.finished.append((in_line, taken_s))
        self.in_line_sum += in_line
        self.taken_sum += taken_s
        if len(self.finished) > self.RATE_SAMPLE:
            old_in_line, old_taken_s = self.finished.popleft()
            self.in_line_sum -= old_in_line
            self.taken_sum -= old_taken_s

    def _rate(self) -> float:
        """Logins a second, from the recent logins' waits; assumed until
        RATE_MEASURED_FROM have finished. A login that came alone says how fast one is
        (fewer than the console can do at once, but then nobody is refused)."""
        if len(self.finished) < self.RATE_MEASURED_FROM:
            return self.ASSUMED_RATE
        return self.in_line_sum / self.taken_sum

    def _retry_after(self, now: float) -> float:
        """The refused agent's slot: the next free one, 1/(rate x PACE) seconds after
        the last booked. Drawn at random over the whole backlog instead, a crowd's
        early comers were refused again and sent to its back: 10,000 agents that
        honoured it took 78 s to log in, against 51 s for agents that came back at
        once. Slots beyond LONGEST_WAIT_S are not booked: those agents are spread over
        that time."""
        rate = self._rate() * self.PACE
        first_free = now + max(self.SHORTEST_WAIT_S, self.waiting / rate)
        slot = max(self.booked_until, first_free) + 1.0 / rate
        if slot - now > self.LONGEST_WAIT_S:
            wait = self.rng.uniform(self.SHORTEST_WAIT_S, self.LONGEST_WAIT_S)
        else:
            self.booked_until, wait = slot, slot - now
        return min(self.LONGEST_WAIT_S, math.ceil(wait * 10) / 10)


@dataclass
class Request:
    """A parsed client frame."""

    type: str
    ref: Any
    body: dict[str, Any]

    def require(self, name: str, kind: type | tuple[type, ...], what: str) -> Any:
        """The body field `name`, which must be present and of `kind`."""
        value = self.body.get(name)
        if value is None:
            raise InvalidInput(f"{name} is required ({what})", field=name)
        # bool is an int in Python, but true is not a number in JSON.
        is_stray_bool = isinstance(value, bool) and bool not in _as_tuple(kind)
        if is_stray_bool or not isinstance(value, kind):
            raise InvalidInput(f"{name} must be {what}", field=name)
        return value

    def optional(self, name: str, kind: type | tuple[type, ...], what: str, default: Any) -> Any:
        """The body field `name` if given (and of `kind`), else `default`."""
        if self.body.get(name) is None:
            return default
        return self.require(name, kind, what)


# What an agent says of itself at login (`agent`; docs/protocol.md): its software, and
# what it acts on (the values are the agent library's own).
AGENT_SOFTWARE_CHARACTERS = 64
AGENT_SOFTWARE = re.compile(rf"[\x20-\x7e]{{1,{AGENT_SOFTWARE_CHARACTERS}}}")


@dataclass(frozen=True)
class AgentSelf:
    """An agent's `software` ("sn-agent 0.2.0") and what it `acts_on` (ACTS_ON), as
    it said at login; empty when it said nothing (an older agent, or another client)."""

    software: str = ""
    acts_on: str = ""


# An agent that said nothing of itself.
UNKNOWN_AGENT = AgentSelf()


def agent_self(request: Request) -> AgentSelf:
    """`login`'s optional `agent` object, checked (fields it does not know are left for
    later revisions of the protocol)."""
    given = request.optional("agent", dict, "an object: {software, acts_on}", None)
    if given is None:
        return UNKNOWN_AGENT
    software = given.get("software", "")
    if software != "" and not (isinstance(software, str) and AGENT_SOFTWARE.fullmatch(software)):
        raise InvalidInput(
            f"agent.software must be 1-{AGENT_SOFTWARE_CHARACTERS} printable ASCII characters",
            field="agent.software",
        )
    acts_on = given.get("acts_on", "")
    if acts_on != "" and acts_on not in ACTS_ON:
        raise InvalidInput(
            f"agent.acts_on must be one of: {', '.join(ACTS_ON)}", field="agent.acts_on"
        )
    return AgentSelf(software, acts_on)


def _as_tuple(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def parse_frame(text: str | None, data: bytes | None) -> Request:
    """Parse one WebSocket message into a Request, or raise a BrokerError saying why."""
    if data is not None:
        raise FrameError("frames are JSON text, not binary", field="frame")
    if len(text.encode()) > MAX_FRAME_BYTES:
        raise TooLarge(f"a frame may hold at most {MAX_FRAME_BYTES} bytes", field="frame")
    body = decode_json(text, whole="frame", malformed=FrameError)
    if not isinstance(body, dict):
        raise FrameError("a frame must be a JSON object", field="frame")
    ref = body.pop("ref", None)
    if ref is not None and not (isinstance(ref, str | int) and len(str(ref)) <= 64):
        raise FrameError("ref must be a string or number of at most 64 characters", field="ref")
    kind = body.pop("type", None)
    if not isinstance(kind, str) or kind not in CLIENT_TYPES:
        expected = ", ".join(sorted(CLIENT_TYPES))
        given = printable_text(repr(kind), 80)
        raise FrameError(f"unknown type {given}; expected one of: {expected}", field="type")
    return Request(kind, ref, body)


def error_frame(error: BrokerError, ref: Any = None) -> dict[str, Any]:
    """The frame that tells the client what was wrong and where."""
    return {"type": "error", "ref": ref, **error.as_dict()}


@dataclass
class TokenBucket:
    """Allows `rate` frames per second with bursts of `burst`."""

    rate: float = RATE_PER_S
    burst: float = BURST
    tokens: float = BURST
    updated: float = field(default_factory=time.monotonic)

    def allow(self) -> bool:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate)
        self.updated = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


# Sessions gone silent ------------------------------------------------------------------
# A web process closes the logged-in sessions it has heard nothing from for
# SILENT_AFTER_HEARTBEATS heartbeats (a peer that vanished without closing: a cable
# pulled, a host frozen), in one sweep a heartbeat for all of them. The web server's
# WebSocket pings did this on a timer of each socket's own: a ping and a pong for every
# agent every minute beside the heartbeats that already say the connection lives, a
# sixth of what an idle fleet cost a web process.

# Heartbeats missed before a session counts as gone: an agent that is slow once (a
# long garbage collection, a busy host) is not cut off.
SILENT_AFTER_HEARTBEATS = 3


class Heard(Protocol):
    """A session: when it last heard from its agent (time.monotonic())."""

    heard_at: float


class SilenceWatch:
    """The logged-in sessions of one process, swept every `heartbeat_s` for those not
    heard from within SILENT_AFTER_HEARTBEATS of them, which are given to `close`."""

    def __init__(self, *, heartbeat_s: float, close: Callable[[Heard], Awaitable[None]]):
        self.heartbeat_s = heartbeat_s
        self.close = close
        self.sessions: set[Heard] = set()
        self.sweeper: asyncio.Task | None = None

    def watch(self, session: Heard) -> None:
        """Watch `session` from now on (on the loop that serves it)."""
        self.sessions.add(session)
        loop = asyncio.get_running_loop()
        if self.sweeper is None or self.sweeper.done() or self.sweeper.get_loop() is not loop:
            self.sweeper = loop.create_task(self._sweep_forever())

    def forget(self, session: Heard) -> None:
        """Stop watching `session` (it ended)."""
        self.sessions.discard(session)

    def silent(self, now: float | None = None) -> list[Heard]:
        """The sessions not heard from within SILENT_AFTER_HEARTBEATS heartbeats."""
        now = time.monotonic() if now is None else now
        limit = now - SILENT_AFTER_HEARTBEATS * self.heartbeat_s
        return [session for session in self.sessions if session.heard_at < limit]

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_s)
            for session in self.silent():
                self.forget(session)
                try:
                    await self.close(session)
                except Exception:  # its socket is gone already: nothing more to do
                    logger.debug("closing a silent session failed", exc_info=True)
