"""Agent library and command line for the agent protocol (docs/protocol.md).

Needs only the `websockets` package: no Django, no settings. As a library:

    async with Agent("ws://console:8000/ws/agent/v1/", token) as agent:
        await agent.advertise({"hostname": "web-1", "software": "IIS", ...})
        await agent.set_policy('accept event.kind == "command"')
        await agent.run(handler)          # notifications -> handler -> ack, reconnecting

As a command (`python -m broker.client --help`): connect with a URL and token, advertise
a model from a JSON file or flags, set a policy from a file, publish, and print
notifications as JSON lines, handing commands to a shell command if asked.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import inspect
import itertools
import json
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any

import websockets
from websockets.exceptions import ConnectionClosed, WebSocketException

RECONNECT_FIRST_S = 0.5
RECONNECT_MAX_S = 30.0
REQUEST_TIMEOUT_S = 30.0
MAX_OUTPUT_CHARS = 4000


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


# Close codes after which reconnecting with the same token is pointless.
FINAL_CLOSE_CODES = {4401, 4403, 4429}


@dataclass(frozen=True)
class Notification:
    """One delivery to this client."""

    delivery: int
    event: str
    sender: int
    channel: str
    sequence: int
    content: dict[str, Any]
    replay: bool = False

    @classmethod
    def from_frame(cls, frame: dict) -> Notification:
        return cls(**{name: frame[name] for name in cls.__dataclass_fields__ if name in frame})


Result = tuple[str, dict | None]
# A handler returns (status, result) to acknowledge, or None to leave it unanswered.
Handler = Callable[[Notification], Result | Awaitable[Result | None] | None]


class Agent:
    """One client session that survives disconnections.

    On every (re)connection it logs in with the last delivery id it received, so the
    server replays exactly what it missed, in channel order, before the live stream.
    """

    def __init__(self, url: str, token: str, *, after: int | None = None) -> None:
        self.url = url
        self.token = token
        self.last_delivery = after
        self.welcome: dict | None = None
        self._socket = None
        self._reader: asyncio.Task | None = None
        self._pending: dict[str, asyncio.Future] = {}
        self._refs = itertools.count(1)
        self._closing = False
        self._notifications: asyncio.Queue = asyncio.Queue()
        self.replayed = asyncio.Event()

    async def __aenter__(self) -> Agent:
        await self.connect()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def connect(self) -> dict:
        """Open the socket and log in; return the server's welcome frame."""
        self._socket = await websockets.connect(self.url, max_size=2**20, open_timeout=30)
        self._closing = False
        self.replayed.clear()
        self._reader = asyncio.create_task(self._read())
        login = {"type": "login", "token": self.token}
        if self.last_delivery is not None:
            login["after"] = self.last_delivery
        self.welcome = await self.request(login)
        return self.welcome

    async def close(self) -> None:
        """Close the session; a later connect() resumes after the last delivery seen."""
        self._closing = True
        if self._socket is not None:
            await self._socket.close()
        if self._reader is not None:
            with contextlib.suppress(asyncio.CancelledError, ConnectionClosed, SessionEnded):
                await self._reader

    async def request(self, frame: dict) -> dict:
        """Send a request and wait for its answer; raise AgentError if refused."""
        ref = str(next(self._refs))
        future = asyncio.get_running_loop().create_future()
        self._pending[ref] = future
        try:
            await self._socket.send(json.dumps({**frame, "ref": ref}))
            return await asyncio.wait_for(future, REQUEST_TIMEOUT_S)
        finally:
            self._pending.pop(ref, None)

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
        self, content: dict, *, selector: str = "", lifetime_s: int = 60, channel: str = "default"
    ) -> dict:
        """Publish an event; return {event, channel, sequence}."""
        frame = {"type": "publish", "content": content, "selector": selector}
        frame.update(lifetime_s=lifetime_s, channel=channel)
        return await self.request(frame)

    async def ack(self, delivery: int, status: str = "ok", result: dict | None = None) -> None:
        """Report what became of a delivery (a command's exit status and output)."""
        await self.request(
            {"type": "ack", "delivery": delivery, "status": status, "result": result}
        )

    async def heartbeat(self) -> dict:
        return await self.request({"type": "heartbeat"})

    async def notifications(self) -> AsyncIterator[Notification]:
        """Notifications of the current connection, replayed ones first."""
        while True:
            item = await self._notifications.get()
            if isinstance(item, BaseException):
                raise item
            yield item

    async def run(self, handler: Handler | None = None, *, reconnect: bool = True) -> None:
        """Hand every notification to `handler` and acknowledge it with the handler's
        (status, result); reconnect after a lost connection, with backoff."""
        delay = RECONNECT_FIRST_S
        while True:
            try:
                if self._socket is None or self._reader is None or self._reader.done():
                    await self.connect()
                delay = RECONNECT_FIRST_S
                async for notification in self.notifications():
                    await self._handle(handler, notification)
            except (WebSocketException, OSError, TimeoutError) as error:
                if not reconnect:
                    raise
                print(f"[agent] connection lost ({error}); again in {delay:.1f} s", file=sys.stderr)
                self._reader = None
                await asyncio.sleep(delay)
                delay = min(delay * 2, RECONNECT_MAX_S)

    async def _handle(self, handler: Handler | None, notification: Notification) -> None:
        outcome = await _outcome(handler, notification)
        if outcome is not None:  # a handler that returns nothing leaves it unanswered
            status, result = outcome
            await self.ack(notification.delivery, status, result)

    async def _read(self) -> None:
        try:
            async for text in self._socket:
                self._dispatch(json.loads(text))
        except ConnectionClosed as closed:
            self._fail_all(_closing_error(closed))
            return
        self._fail_all(_closing_error(None, self._socket))

    def _dispatch(self, frame: dict) -> None:
        kind, ref = frame.get("type"), frame.get("ref")
        if kind == "notification":
            self.last_delivery = frame["delivery"]
            self._notifications.put_nowait(Notification.from_frame(frame))
        elif kind == "replayed":
            self.replayed.set()
        elif ref is not None and ref in self._pending:
            future = self._pending.pop(ref)
            if kind == "error":
                future.set_exception(AgentError(frame))
            else:
                future.set_result(frame)
        elif kind == "error":
            print(f"[agent] server error: {frame}", file=sys.stderr)

    def _fail_all(self, error: BaseException) -> None:
        for future in self._pending.values():
            if not future.done():
                future.set_exception(error)
        self._pending.clear()
        if not self._closing:  # our own close() is not news to the notification reader
            self._notifications.put_nowait(error)


async def _outcome(handler: Handler | None, notification: Notification) -> Result | None:
    """What a handler, plain or async, made of a notification (None without one)."""
    outcome = handler(notification) if handler is not None else None
    return await outcome if inspect.isawaitable(outcome) else outcome


def _closing_error(closed: ConnectionClosed | None, socket=None) -> BaseException:
    frame = closed.rcvd if closed is not None else getattr(socket, "close_rcvd", None)
    if frame is not None and frame.code in FINAL_CLOSE_CODES:
        return SessionEnded(frame.code, frame.reason)
    return closed or ConnectionError("the server closed the connection")


def shell_handler(command: str) -> Handler:
    """A handler that runs `command` with the notification as JSON on its standard
    input (and SN_* variables); exit status 0 acknowledges "ok", anything else
    "failed", and the output becomes the result."""

    async def run(notification: Notification) -> Result:
        payload = json.dumps(asdict(notification))
        env = {
            **os.environ,
            "SN_DELIVERY": str(notification.delivery),
            "SN_EVENT": notification.event,
            "SN_CONTENT": json.dumps(notification.content),
        }
        process = await asyncio.create_subprocess_shell(
            command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env=env,
        )
        output, _ = await process.communicate(payload.encode())
        text = output.decode(errors="replace")[-MAX_OUTPUT_CHARS:]
        status = "ok" if process.returncode == 0 else "failed"
        return status, {"exit_code": process.returncode, "output": text}

    return run


# Command line ---------------------------------------------------------------------


def parse_value(text: str) -> Any:
    """`--set load=0.5` gives 0.5, `cgi=true` gives True, anything else stays text."""
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return value if isinstance(value, bool | int | float) else text


def parse_assignments(pairs: list[str]) -> dict[str, Any]:
    values = {}
    for pair in pairs:
        name, sep, text = pair.partition("=")
        if not sep or not name:
            raise SystemExit(f"--set expects name=value, not {pair!r}")
        values[name] = parse_value(text)
    return values


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m broker.client", description="A Selective Notification agent."
    )
    parser.add_argument("url", help="ws://host:port/ws/agent/v1/")
    parser.add_argument("--token", default=os.environ.get("SN_TOKEN"), help="or set SN_TOKEN")
    parser.add_argument("--advertise", metavar="FILE", help="JSON object of the model's values")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--policy-file", metavar="FILE")
    parser.add_argument("--publish", metavar="JSON", help="content of an event to publish")
    parser.add_argument("--selector", default="")
    parser.add_argument("--lifetime", type=int, default=60, metavar="SECONDS")
    parser.add_argument("--channel", default="default")
    parser.add_argument("--listen", action="store_true", help="print notifications")
    parser.add_argument("--handler", metavar="COMMAND", help="run for each notification")
    parser.add_argument("--after", type=int, help="last delivery id already received")
    return parser


async def run_command(args: argparse.Namespace) -> None:
    agent = Agent(args.url, args.token, after=args.after)
    await agent.connect()
    await _apply_flags(agent, args)
    if args.listen or args.handler:
        await agent.run(_printing(shell_handler(args.handler) if args.handler else None))
    await agent.close()


async def _apply_flags(agent: Agent, args: argparse.Namespace) -> None:
    if args.advertise:
        with open(args.advertise) as file:
            await agent.advertise(json.load(file) | parse_assignments(args.set))
    elif args.set:
        await agent.update(parse_assignments(args.set))
    if args.policy_file:
        with open(args.policy_file) as file:
            version = await agent.set_policy(file.read())
        print(json.dumps({"policy_version": version}), flush=True)
    if args.publish:
        reply = await agent.publish(
            json.loads(args.publish),
            selector=args.selector,
            lifetime_s=args.lifetime,
            channel=args.channel,
        )
        print(json.dumps({k: reply[k] for k in ("event", "channel", "sequence")}), flush=True)


def _printing(handler: Handler | None) -> Handler:
    """Print each notification as a JSON line, then hand it on."""

    async def run(notification: Notification) -> Result | None:
        print(json.dumps(asdict(notification)), flush=True)
        return await _outcome(handler, notification)

    return run


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not args.token:
        print("a token is needed: --token or SN_TOKEN", file=sys.stderr)
        return 2
    try:
        asyncio.run(run_command(args))
    except AgentError as error:
        print(json.dumps({"error": error.frame}), file=sys.stderr)
        return 1
    except SessionEnded as ended:
        print(str(ended), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
