"""The agent protocol's client side (docs/protocol.md): one client's sessions, in order
and each once.

Needs only the `websockets` package. As a library:

    async with Agent("ws://console:8000/ws/agent/v1/", token) as agent:
        await agent.advertise({"hostname": "web-1", "software": "IIS", ...})
        await agent.set_policy('accept event.kind == "command"')
        await agent.run(handler)          # notifications -> handler -> ack, reconnecting

The service (`sn-agent run`, sn_agent.service) builds on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import json
import logging
import random
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Awaitable, Callable, Dict, Optional, Tuple, Union

import websockets
from websockets.exceptions import ConnectionClosed, WebSocketException

from sn_agent import signatures

log = logging.getLogger(__name__)

RECONNECT_FIRST_S = 0.5
RECONNECT_MAX_S = 30.0
REQUEST_TIMEOUT_S = 30.0
MAX_OUTPUT_CHARS = 4000
# Confirmations are coalesced: one `received` frame per this many seconds at most.
RECEIPT_DELAY_S = 0.2
# A gap in the positions (a later delivery came first) may be a push still on its way
# from another worker; after this long it is asked for again.
GAP_WAIT_S = 1.0
# How often an idle session confirms (which is also its heartbeat): as the server's
# welcome asks (`heartbeat_s`), but never less often than this.
HEARTBEAT_MAX_S = 300.0
CLOSE_CONFIRM_TIMEOUT_S = 2.0
# How long a login whose socket closed waits for the reader to say why it closed.
CLOSE_READ_S = 1.0
# What an agent acts on, as it says at login (`agent.acts_on`, docs/protocol.md):
# events whose sender's signature and attestations hold ([trust]); anything the
# console hands it (insecure_accept_unsigned); or no action at all (neither: it still
# notes alerts).
ACTS_ON_SIGNED, ACTS_ON_ANYTHING, ACTS_ON_NOTHING = "signed", "anything", "nothing"
ACTS_ON = (ACTS_ON_SIGNED, ACTS_ON_ANYTHING, ACTS_ON_NOTHING)
# The share of the server's frame rate and burst (its welcome's `limits`) an agent
# allows itself: what crosses the network late arrives bunched, and the server refuses
# a frame over its limit without reading it.
PACE_SHARE = 0.8
BURST_SHARE = 0.5
# How often a frame refused for its rate (not processed, so safe to send again) is sent
# again, a pace's interval apart, before the refusal is the caller's.
RATE_RETRIES = 20


# What `_confirm` returns when the server did not answer in time.
_UNANSWERED = object()


class AgentError(Exception):
    """The server refused a request; `code` and `field` say what and where."""

    def __init__(self, frame: dict) -> None:
        super().__init__(
            f"{frame.get('code')}: {frame.get('message')} (field {frame.get('field')})"
        )
        self.code = frame.get("code")
        self.message = frame.get("message")
        self.field = frame.get("field")
        self.frame = frame


class SessionEnded(Exception):
    """The server closed the session for good (bad token, revoked, abusive)."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(f"session closed by the server with code {code} {reason}".strip())
        self.code = code


class NotConnected(ConnectionError):
    """A request was made while no session is open."""


class TryAgainLater(ConnectionError):
    """The server was too busy to log this agent in and said when to come back."""

    def __init__(self, retry_after_s: float, message: str) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


# Close codes after which reconnecting with the same token is pointless.
FINAL_CLOSE_CODES = {4401, 4403, 4429}
# What a lost connection looks like; run() reconnects after any of these.
TRANSIENT_ERRORS = (WebSocketException, OSError, TimeoutError, asyncio.TimeoutError)


@dataclass(frozen=True)
class Notification:
    """One delivery to this client."""

    delivery: int
    event: str
    sender: int
    channel: str
    sequence: int
    content: dict[str, Any]
    position: int = 0
    replay: bool = False
    # The sender's signature and the attestations of its attributes (sn_agent.signatures).
    seal: Optional[Dict[str, Any]] = None

    @classmethod
    def from_frame(cls, frame: dict) -> Notification:
        return cls(**{name: frame[name] for name in cls.__dataclass_fields__ if name in frame})


# Typing's names, not `X | Y`: this module runs on Python 3.9.
Result = Tuple[str, Optional[dict]]
# A handler returns (status, result) to acknowledge, or None to leave it unanswered.
Handler = Callable[[Notification], Union[Result, Awaitable[Optional[Result]], None]]


class Pace:
    """Frames sent under the server's rate limit: a token bucket like the server's own
    (broker.protocol.TokenBucket), at a share of its rate and burst. A frame waits for
    its token instead of being refused, unanswered, for coming too fast."""

    def __init__(self, rate: float, burst: float) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = burst
        self.updated = time.monotonic()

    @classmethod
    def from_limits(cls, limits: Any) -> Optional[Pace]:
        """The pace for a welcome's `limits` (None: the server states none)."""
        limits = limits if isinstance(limits, dict) else {}
        rate, burst = limits.get("frames_per_s"), limits.get("burst")
        if not all(isinstance(v, (int, float)) and v > 0 for v in (rate, burst)):
            return None
        return cls(rate * PACE_SHARE, max(1.0, burst * BURST_SHARE))

    @property
    def interval_s(self) -> float:
        return 1.0 / self.rate

    async def take(self) -> None:
        """Wait for a token, and take it."""
        while True:
            now = time.monotonic()
            self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate)
            self.updated = now
            if self.tokens >= 1:
                self.tokens -= 1
                return
            await asyncio.sleep((1 - self.tokens) / self.rate)


class _Session:
    """One WebSocket connection and what belongs to it alone: its reader, its requests
    waiting for answers, its pace, and how it ended. Nothing of it outlives the
    connection."""

    def __init__(self, socket) -> None:
        self.socket = socket
        self.pending: dict[str, asyncio.Future] = {}
        self.ended: asyncio.Future = asyncio.get_running_loop().create_future()
        self.tasks: list[asyncio.Task] = []
        self.welcomed = False  # its login was accepted
        self.busy: Optional[dict] = None  # the server's `busy` refusal, as it connected
        self.pace: Optional[Pace] = None  # from the welcome's limits

    def end(self, error: BaseException) -> None:
        """Fail the requests still waiting and record why the session ended."""
        for future in self.pending.values():
            if not future.done():
                future.set_exception(error)
                # Read here, so that a request that was given up meanwhile (its caller
                # cancelled) does not leave an exception nobody retrieved.
                future.exception()
        self.pending.clear()
        if not self.ended.done():
            self.ended.set_result(error)

    async def close(self) -> None:
        # Ended first: a task that loops while the session lasts (the heartbeat) then
        # stops even if its cancellation is lost on the way.
        self.end(ConnectionError("the session was closed"))
        for task in self.tasks:
            task.cancel()
        with contextlib.suppress(Exception):
            await self.socket.close()
        await asyncio.gather(*self.tasks, return_exceptions=True)


class Agent:
    """One client that survives disconnections, with at most one open session.

    Every delivery carries its position in this client's stream (1, 2, 3...). The
    library hands notifications to the application in position order, each once: it
    drops repeats, holds back one that overtook an earlier one, asks the server again
    for a gap that does not fill by itself, and confirms what it has (`received`), so
    that the server sends again whatever it committed and the agent did not confirm.
    On every (re)connection it logs in with the last position it has, and the server
    replays what came after it (docs/protocol.md, "The delivery contract").
    """

    def __init__(
        self,
        url: str,
        token: str,
        *,
        after_position: int | None = None,
        observer: Callable[[Notification], None] | None = None,
        about: dict | None = None,
    ) -> None:
        self.url = url
        self.token = token
        # What the agent says of itself at login: {"software": "sn-agent 0.2.0",
        # "acts_on": "signed"} (docs/protocol.md); the console shows it.
        self.about = about
        # Sees every notification as it comes off the wire, repeats included, before
        # any ordering (for monitoring and benchmarks; the application uses run()).
        self.observer = observer
        self.position = after_position  # every delivery up to here was taken in
        self.welcome: dict | None = None
        self.replayed = asyncio.Event()
        self.duplicates = 0  # repeats dropped (counted for tests and benchmarks)
        self.server_position = 0  # the server's last position, as last heard
        self._session: _Session | None = None
        self._refs = itertools.count(1)
        self._held: dict[int, Notification] = {}  # came before an earlier position
        self._fresh_max = 0  # highest position taken in before the first cursor
        self._ready: asyncio.Queue[Notification] = asyncio.Queue()
        self._confirmed = -1
        self._confirming: asyncio.Task | None = None
        self._repairing: asyncio.Task | None = None
        self._unsent_acks: dict[int, tuple[str, dict | None]] = {}

    async def __aenter__(self) -> Agent:
        await self.connect()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    @property
    def connected(self) -> bool:
        return self._session is not None and not self._session.ended.done()

    @property
    def logged_in(self) -> bool:
        """Connected, and the server accepted this session's login."""
        return self.connected and self._session.welcomed

    async def connect(self) -> dict:
        """Open a session and log in (closing any session still open first); return
        the server's welcome frame."""
        await self._end_session()
        # No WebSocket pings: the heartbeat (a confirmation the server answers) tells
        # whether the connection lives, and each ping would be a frame more for the
        # server to answer, for every agent of the fleet.
        try:
            socket = await websockets.connect(
                self.url, max_size=2**20, open_timeout=30, ping_interval=None
            )
        except WebSocketException as refused:
            busy = _busy_refusal(refused)
            if busy is None:
                raise
            raise busy from refused
        session = self._session = _Session(socket)
        session.tasks.append(asyncio.create_task(self._read(session)))
        self.replayed.clear()
        if self.position is None and self._fresh_max:
            # The first replay was cut short: it was in order, so resume after it.
            self.position = self._fresh_max
        login = {"type": "login", "token": self.token}
        if self.position is not None:
            login["after_position"] = self.position
        if self.about is not None:
            login["agent"] = self.about
        try:
            self.welcome = await self.request(login)
        except ConnectionClosed as closed:
            # Refused as busy as it connected, the socket may close before the login
            # is sent: the reader has the `busy` frame that came first, and with it
            # how long to stay away (coming back at once would only be refused again).
            why = await _why_ended(session, closed)
            await self._end_session()
            raise why from None
        except BaseException:
            await self._end_session()
            raise
        session.welcomed = True
        session.pace = Pace.from_limits(self.welcome.get("limits"))
        session.tasks.append(asyncio.create_task(self._heartbeat(session)))
        return self.welcome

    async def close(self) -> None:
        """Close the session; a later connect() resumes after the last position."""
        for task in (self._confirming, self._repairing):
            if task is not None:
                task.cancel()
        if self.connected and (self.position or 0) > self._confirmed:
            # So that the server's record is current; but closing must not hang on it.
            confirming = asyncio.ensure_future(self._confirm())
            with contextlib.suppress(asyncio.TimeoutError):
                await _within(confirming, CLOSE_CONFIRM_TIMEOUT_S)
            confirming.cancel()
        await self._end_session()

    async def _end_session(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    async def request(self, frame: dict) -> dict:
        """Send a request and wait for its answer; raise AgentError if refused. Frames
        keep to the server's pace; one refused for its rate anyway (it was not read)
        is sent again."""
        for attempt in range(RATE_RETRIES):
            try:
                return await self._request_once(frame)
            except AgentError as error:
                pace = self._session.pace if self._session is not None else None
                if error.code != "rate_limited" or pace is None or attempt == RATE_RETRIES - 1:
                    raise
                await asyncio.sleep(pace.interval_s)
        raise AssertionError("unreachable")  # pragma: no cover

    async def _request_once(self, frame: dict) -> dict:
        session = self._session
        if session is None or session.ended.done():
            raise NotConnected("not connected")
        if session.pace is not None:
            await session.pace.take()
        ref = str(next(self._refs))
        future = asyncio.get_running_loop().create_future()
        session.pending[ref] = future
        try:
            await session.socket.send(json.dumps({**frame, "ref": ref}))
            return await _within(future, REQUEST_TIMEOUT_S)
        finally:
            session.pending.pop(ref, None)

    async def advertise(self, values: dict) -> None:
        """State every attribute this client states itself."""
        await self.request({"type": "advertise", "values": values})

    async def update(self, values: dict) -> None:
        """Change some of this client's own attributes."""
        await self.request({"type": "update", "values": values})

    async def set_policy(self, text: str) -> int:
        """Set this client's connectivity policy; return its version number."""
        return (await self.request({"type": "policy", "text": text}))["policy_version"]

    async def publish(
        self,
        content: dict,
        *,
        selector: str = "",
        lifetime_s: int = 60,
        channel: str = "default",
        idempotency_key: str | None = None,
        signing_key=None,
    ) -> dict:
        """Publish an event; return {event, channel, sequence}. With an
        `idempotency_key`, publishing again (say after a lost answer) returns the
        first event instead of publishing a second one. With a `signing_key` (an
        Ed25519 private key), the event is signed as this client
        (sn_agent.signatures): agents that verify act only on signed events."""
        frame = {"type": "publish", "content": content, "selector": selector}
        frame.update(lifetime_s=lifetime_s, channel=channel)
        if idempotency_key is not None:
            frame["idempotency_key"] = idempotency_key
        if signing_key is not None:
            frame.update(self._signed(signing_key, frame))
        return await self.request(frame)

    def _signed(self, signing_key, frame: dict) -> dict:
        sender = (self.welcome or {}).get("client")
        if not sender:
            raise AgentError({"code": "not_logged_in", "message": "log in before signing"})
        return signatures.signed_publish(
            signing_key,
            sender=sender,
            content=frame["content"],
            selector=frame["selector"],
            channel=frame["channel"],
            lifetime_s=frame["lifetime_s"],
            now=time.time(),
        )

    async def ack(self, delivery: int, status: str = "ok", result: dict | None = None) -> None:
        """Report what became of a delivery (a command's exit status and output), and
        confirm with it what this agent has, if that is more than it last confirmed
        (the `received` it would send a moment later is then not needed)."""
        frame = {"type": "ack", "delivery": delivery, "status": status, "result": result}
        position = self.position
        if position is not None and position > self._confirmed:
            frame["position"] = position
        answer = await self.request(frame)
        if "position" in frame and "confirmed_position" in answer:  # older servers: no
            self._heard_confirmed(position, answer)

    async def heartbeat(self) -> dict:
        return await self.request({"type": "heartbeat"})

    async def notifications(self) -> AsyncIterator[Notification]:
        """Notifications in position order, each once; raises when the session ends
        and none is left to hand out."""
        while True:
            if not self._ready.empty():
                yield self._ready.get_nowait()
                continue
            session = self._session
            if session is None:
                raise NotConnected("not connected")
            taken = await _next_unless_ended(self._ready, session.ended)
            if taken is not None:
                yield taken
            elif self._ready.empty():
                raise session.ended.result()

    async def run(
        self,
        handler: Handler | None = None,
        *,
        reconnect: bool = True,
        on_connect: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """Hand every notification to `handler` and acknowledge it with the handler's
        (status, result); reconnect after a lost connection, with backoff, and await
        `on_connect()` after each login (to state attributes again, say)."""
        delay = RECONNECT_FIRST_S
        while True:
            try:
                if not self.connected:
                    await self.connect()
                    if on_connect is not None:
                        await on_connect()
                    await self._send_unsent_acks()
                delay = RECONNECT_FIRST_S
                async for notification in self.notifications():
                    await self._handle(handler, notification)
            except (*TRANSIENT_ERRORS, AgentError) as error:
                # A refusal that is not final (say the server could not reach its
                # database) is tried again like a lost connection.
                final = isinstance(error, AgentError) and error.code == "authentication_failed"
                if final or not reconnect:
                    raise
                await self._end_session()
                wait = reconnect_wait(delay, asked_s=_asked_to_wait(error))
                log.warning("connection lost (%s); again in %.1f s", error, wait)
                await asyncio.sleep(wait)
                delay = min(delay * 2, RECONNECT_MAX_S)

    async def _handle(self, handler: Handler | None, notification: Notification) -> None:
        outcome = await _outcome(handler, notification)
        if outcome is None:  # a handler that returns nothing leaves it unanswered
            return
        # Kept until the server has it: answered by the application, it is sent again
        # after a reconnection (an ack repeated with the same answer is harmless).
        self._unsent_acks[notification.delivery] = outcome
        await self._send_unsent_acks()

    async def _send_unsent_acks(self) -> None:
        """Send the application's answers the server does not have yet; a lost
        connection or a server failure leaves them for the next attempt."""
        for delivery, (status, result) in list(self._unsent_acks.items()):
            try:
                await self.ack(delivery, status, result)
            except AgentError as error:
                if error.code == "internal":
                    raise
                # Refused for good (say answered otherwise before): retrying won't help.
                log.warning("ack of delivery %s refused: %s", delivery, error)
            del self._unsent_acks[delivery]

    # Reading ------------------------------------------------------------------------

    async def _read(self, session: _Session) -> None:
        try:
            async for text in session.socket:
                self._dispatch(session, json.loads(text))
        except ConnectionClosed as closed:
            session.end(_closing_error(closed, busy=session.busy))
            return
        except Exception as error:  # a frame this library cannot read: a lost session
            session.end(ConnectionError(f"unreadable frame from the server: {error}"))
            return
        session.end(_closing_error(None, session.socket, busy=session.busy))

    def _dispatch(self, session: _Session, frame: dict) -> None:
        kind, ref = frame.get("type"), frame.get("ref")
        if kind == "notification":
            notification = Notification.from_frame(frame)
            if self.observer is not None:
                self.observer(notification)
            self._take(notification)
        elif kind == "replayed":
            self._covered(frame.get("through", 0))
        if ref is not None and ref in session.pending and kind != "notification":
            future = session.pending.pop(ref)
            if kind == "error":
                future.set_exception(AgentError(frame))
            else:
                future.set_result(frame)
        elif kind == "error" and frame.get("code") == "busy":
            session.busy = frame  # refused as it connected: the close follows
        elif kind == "error":
            log.warning("server error: %s", frame)

    def _take(self, notification: Notification) -> None:
        """Take in a notification: hand it on in order, hold it back, or drop it."""
        position = notification.position
        if self.position is None:  # a first login without a cursor: the replay is in order
            self._ready.put_nowait(notification)
            self._fresh_max = max(self._fresh_max, position)
            return
        if position <= self.position or position in self._held:
            self.duplicates += 1
            return
        self._held[position] = notification
        self._release()

    def _release(self) -> None:
        while self.position + 1 in self._held:
            self.position += 1
            self._ready.put_nowait(self._held.pop(self.position))
        self._confirm_soon()
        if self._held:
            self._repair_soon()

    def _covered(self, through: int) -> None:
        """The server replayed everything up to `through` that is still live: any
        position up to it that did not come is gone (its event expired, or, on a
        login without a cursor, it was answered)."""
        for position in sorted(p for p in self._held if p <= through):
            self._ready.put_nowait(self._held.pop(position))
        self.position = max(self.position or 0, self._fresh_max, through)
        self._release()
        self.replayed.set()

    # Confirming and repairing -------------------------------------------------------

    def _confirm_soon(self) -> None:
        if self._confirming is None or self._confirming.done():
            self._confirming = asyncio.create_task(self._confirm_later())

    async def _confirm_later(self) -> None:
        await asyncio.sleep(RECEIPT_DELAY_S)
        if self.position is not None and self.position > self._confirmed:
            await self._confirm()

    async def _confirm(self) -> object:
        """Tell the server what this agent has; learn how far its stream goes. Returns
        _UNANSWERED if no answer came in time."""
        position = self.position or 0
        try:
            answer = await self.request({"type": "received", "position": position})
        except asyncio.TimeoutError:
            return _UNANSWERED
        except (NotConnected, AgentError, *TRANSIENT_ERRORS):
            return None
        self._heard_confirmed(position, answer)
        return None

    def _heard_confirmed(self, position: int, answer: dict) -> None:
        """The server recorded that this agent has everything up to `position`."""
        self._confirmed = max(self._confirmed, position)
        self.server_position = answer.get("last_position", 0)
        if self.server_position > position:
            self._repair_soon()

    def _repair_soon(self) -> None:
        if self._repairing is None or self._repairing.done():
            self._repairing = asyncio.create_task(self._repair_later())

    async def _repair_later(self) -> None:
        """If the stream is still stuck at the same position after a while, ask the
        server to send again everything after it."""
        stuck_at = self.position
        await asyncio.sleep(GAP_WAIT_S)
        missing = self._held or self.server_position > (self.position or 0)
        if self.position == stuck_at and missing and self.position is not None:
            with contextlib.suppress(NotConnected, AgentError, *TRANSIENT_ERRORS):
                await self.request({"type": "resend", "after_position": self.position})

    async def _heartbeat(self, session: _Session) -> None:
        """Confirm (which is also a heartbeat) at the interval the server asked for. A
        heartbeat unanswered within REQUEST_TIMEOUT_S ends the session: the socket sends
        no WebSocket pings, so this is how a connection that died unclosed is noticed."""
        interval = min(HEARTBEAT_MAX_S, float((self.welcome or {}).get("heartbeat_s", 30)))
        while not session.ended.done():
            await asyncio.sleep(interval)
            if await self._confirm() is _UNANSWERED and not session.ended.done():
                session.end(ConnectionError("no answer to a heartbeat: the connection is lost"))
                return


async def _why_ended(session: _Session, closed: ConnectionClosed) -> BaseException:
    """Why `session` ended, as its reader tells once it has read up to the close
    (`closed` if it has not within a second)."""
    with contextlib.suppress(asyncio.TimeoutError):
        return await _within(asyncio.shield(session.ended), CLOSE_READ_S)
    return closed


async def _within(future: Awaitable, seconds: float) -> Any:
    """`future`'s result, or asyncio.TimeoutError after `seconds` (the future is left
    running). Not asyncio.wait_for: before Python 3.12 it swallows a cancellation that
    comes as the answer does, and a stopped agent would carry on; asyncio.wait does
    not, and asyncio.timeout is Python 3.11's."""
    future = asyncio.ensure_future(future)
    done, _ = await asyncio.wait({future}, timeout=seconds)
    if not done:
        raise asyncio.TimeoutError(f"no answer within {seconds:g} s")
    return future.result()


async def _next_unless_ended(queue: asyncio.Queue, ended: asyncio.Future) -> Any:
    """The queue's next item, or None once `ended` is done with the queue empty."""
    getter = asyncio.ensure_future(queue.get())
    try:
        await asyncio.wait({getter, ended}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        getter.cancel()  # the caller was cancelled: leave no task behind
        raise
    if getter.done():
        return getter.result()
    # Not awaited: a cancellation of the caller arriving while it waited for the
    # getter to finish cancelling would have been taken for the getter's own, and
    # lost. A cancelled getter leaves its item, if one came, in the queue.
    getter.cancel()
    return None


async def _outcome(handler: Handler | None, notification: Notification) -> Result | None:
    """What a handler, plain or async, made of a notification (None without one)."""
    outcome = handler(notification) if handler is not None else None
    return await outcome if inspect.isawaitable(outcome) else outcome


def reconnect_wait(ceiling_s: float, *, asked_s: float = 0.0) -> float:
    """How long to wait before connecting again: what the server asked (a `busy`
    refusal), plus a random share of the back-off's ceiling, so that a fleet that lost
    its connections together does not come back together ("full jitter")."""
    return asked_s + random.uniform(0.0, ceiling_s)


def _asked_to_wait(error: BaseException) -> float:
    """The seconds a `busy` refusal asked this agent to stay away (0 for any other)."""
    if isinstance(error, TryAgainLater):
        asked = error.retry_after_s
    elif isinstance(error, AgentError) and error.code == "busy":
        asked = error.frame.get("retry_after_s")
    else:
        return 0.0
    if isinstance(asked, bool) or not isinstance(asked, (int, float)) or asked != asked:
        return 0.0
    return min(max(float(asked), 0.0), 2 * RECONNECT_MAX_S)


def _busy_refusal(refused: WebSocketException) -> Optional[TryAgainLater]:
    """The busy console's refusal of the handshake itself (503, the `busy` frame as
    its body, `Retry-After` in whole seconds), as TryAgainLater; None for any other
    failed handshake. Read from websockets' InvalidStatus (14 and later) or its legacy
    client's InvalidStatusCode (13), which has the headers but not the body."""
    response = getattr(refused, "response", None)
    status = getattr(response, "status_code", getattr(refused, "status_code", None))
    headers = getattr(response, "headers", getattr(refused, "headers", None))
    if status != 503 or headers is None:
        return None
    frame = _json_object(getattr(response, "body", None) or b"")
    asked = frame.get("retry_after_s") if frame.get("code") == "busy" else None
    if asked is None:
        asked = _number(headers.get("Retry-After"))
    if asked is None:
        return None  # a 503 that is not the console's: an ordinary failure
    return TryAgainLater(asked, f"busy: {frame.get('message', 'the server is busy')}")


def _json_object(body: bytes) -> dict:
    try:
        value = json.loads(body)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _number(text: Optional[str]) -> Optional[float]:
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


def _closing_error(
    closed: Optional[ConnectionClosed], socket=None, *, busy: Optional[dict] = None
) -> BaseException:
    frame = closed.rcvd if closed is not None else getattr(socket, "close_rcvd", None)
    if frame is not None and frame.code in FINAL_CLOSE_CODES:
        return SessionEnded(frame.code, frame.reason)
    if busy is not None:
        return TryAgainLater(busy.get("retry_after_s"), f"busy: {busy.get('message')}")
    return closed or ConnectionError("the server closed the connection")
