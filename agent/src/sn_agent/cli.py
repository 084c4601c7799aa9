"""`sn-agent`: run the agent, check its configuration, say how it is doing, or open
one session by hand to try the protocol.

    sn-agent run --config /etc/sn-agent/agent.toml
    sn-agent check-config --config /etc/sn-agent/agent.toml
    sn-agent status --config /etc/sn-agent/agent.toml [--json]
    sn-agent session ws://console:8000/ws/agent/v1/ --token snt_... --set load=0.4 --listen
    sn-agent keygen --out sender.pem
    sn-agent publish wss://console/ws/agent/v1/ --token-file token --key-file sender.pem \
        --content '{"kind": "command", "action": "status"}' --selector '...'
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from dataclasses import asdict
from typing import Any, Dict, List, Optional

from sn_agent import __version__, publisher
from sn_agent.actions import alive
from sn_agent.client import (
    ACTS_ON_ANYTHING,
    ACTS_ON_NOTHING,
    ACTS_ON_SIGNED,
    Agent,
    AgentError,
    Notification,
    SessionEnded,
)
from sn_agent.config import ConfigError, check, load, warnings
from sn_agent.journal import Journal, StateInUse

DEFAULT_CONFIG = "/etc/sn-agent/agent.toml"
# What check-config says an agent acts on (sn_agent.config.Config.acts_on).
ACTS_ON_WORDS = {
    ACTS_ON_SIGNED: "acts only on signed events",
    ACTS_ON_ANYTHING: "INSECURE: acts on unsigned events",
    ACTS_ON_NOTHING: "runs no action: no [trust]",
}
STATUS_DELIVERIES = 10


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sn-agent", description="The Selective Notification agent."
    )
    parser.add_argument("--version", action="version", version=f"sn-agent {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = commands.add_parser("run", help="run the agent until SIGTERM (SIGHUP reloads)")
    checking = commands.add_parser("check-config", help="check a configuration file")
    status = commands.add_parser("status", help="connected or not, position, last deliveries")
    for sub in (run, checking, status):
        sub.add_argument("--config", default=DEFAULT_CONFIG, metavar="FILE")
    status.add_argument("--json", action="store_true", help="as one JSON object")
    add_session_parser(commands)
    publisher.add_parsers(commands)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except ConfigError as error:
        print(f"sn-agent: {args.config}: {error}", file=sys.stderr)
        return 2
    except StateInUse as error:
        print(f"sn-agent: state_dir: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def command_run(args: argparse.Namespace) -> int:
    from sn_agent.logs import capture_library_logs
    from sn_agent.service import serve

    config = load(args.config)
    config.token()  # refused now, before anything starts, if it is not private
    capture_library_logs()
    return serve(config)


def command_check_config(args: argparse.Namespace) -> int:
    config = load(args.config)
    problems = check(config)
    for problem in problems:
        print(f"sn-agent: {args.config}: {problem}", file=sys.stderr)
    if problems:
        return 2
    print(
        f"{args.config}: ok ({len(config.attributes)} static attributes, "
        f"{len(config.providers)} providers, {len(config.actions)} actions; "
        f"{ACTS_ON_WORDS[config.acts_on]})"
    )
    for warning in warnings(config):
        print(f"sn-agent: {args.config}: warning: {warning}", file=sys.stderr)
    return 0


def command_status(args: argparse.Namespace) -> int:
    config = load(args.config)
    report = {**status_report(config.state_dir), "acts_on": config.acts_on}
    if args.json:
        print(json.dumps(report))
    else:
        print(status_text(report))
    return 0 if report["running"] else 3


def status_report(state_dir) -> Dict[str, Any]:
    """What the journal in `state_dir` says, and whether its agent still runs."""
    if not (state_dir / "journal.sqlite3").exists():
        return {"running": False, "connected": False, "position": None, "deliveries": []}
    journal = Journal(state_dir, read_only=True)
    try:
        facts = journal.facts()
        pid = facts.get("pid")
        running = isinstance(pid, int) and alive(pid)
        entries = journal.latest(STATUS_DELIVERIES)
        position = journal.position()
    finally:
        journal.close()
    return {
        "running": running,
        "pid": facts.get("pid"),
        "connected": running and bool(facts.get("connected")),
        "connected_at": facts.get("connected_at"),
        "position": position,
        "deliveries": [asdict(entry) for entry in entries],
    }


def status_text(report: Dict[str, Any]) -> str:
    state = "connected" if report["connected"] else "not connected"
    running = f"running (pid {report['pid']})" if report["running"] else "not running"
    lines = [f"agent: {running}, {state}; {ACTS_ON_WORDS[report['acts_on']]}"]
    lines.append(f"position: {report['position']}")
    for entry in report["deliveries"]:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(entry["taken_at"]))
        outcome = entry["status"] or entry["state"]
        answered = ", answered" if entry["answered"] else ""
        action = entry["action"] or "-"
        lines.append(f"  {entry['position']:>6}  {when}  {action:<16} {outcome}{answered}")
    return "\n".join(lines)


# One session by hand --------------------------------------------------------------------


def add_session_parser(commands) -> None:
    session = commands.add_parser(
        "session", help="open one session by hand: advertise, set a policy, publish, listen"
    )
    session.add_argument("url", help="ws://host:port/ws/agent/v1/")
    session.add_argument("--token", default=os.environ.get("SN_TOKEN"), help="or set SN_TOKEN")
    session.add_argument("--advertise", metavar="FILE", help="JSON object of the model's values")
    session.add_argument("--set", action="append", default=[], metavar="NAME=VALUE")
    session.add_argument("--policy-file", metavar="FILE")
    session.add_argument("--publish", metavar="JSON", help="content of an event to publish")
    session.add_argument("--selector", default="")
    session.add_argument("--lifetime", type=int, default=60, metavar="SECONDS")
    session.add_argument("--channel", default="default")
    session.add_argument("--listen", action="store_true", help="print notifications")
    session.add_argument(
        "--after", type=int, metavar="POSITION", help="last delivery position already received"
    )
    session.add_argument(
        "--idempotency-key", help="publishing again with this key returns the first event"
    )


def command_session(args: argparse.Namespace) -> int:
    if not args.token:
        print("a token is needed: --token or SN_TOKEN", file=sys.stderr)
        return 2
    try:
        asyncio.run(run_session(args))
    except AgentError as error:
        print(json.dumps({"error": error.frame}), file=sys.stderr)
        return 1
    except SessionEnded as ended:
        print(str(ended), file=sys.stderr)
        return 1
    return 0


async def run_session(args: argparse.Namespace) -> None:
    agent = Agent(args.url, args.token, after_position=args.after)
    await agent.connect()
    await _apply_flags(agent, args)
    if args.listen:
        await agent.run(_print)
    await agent.close()


async def _apply_flags(agent: Agent, args: argparse.Namespace) -> None:
    if args.advertise:
        with open(args.advertise) as file:
            await agent.advertise({**json.load(file), **parse_assignments(args.set)})
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
            idempotency_key=args.idempotency_key,
        )
        print(json.dumps({k: reply[k] for k in ("event", "channel", "sequence")}), flush=True)


def _print(notification: Notification) -> None:
    """Print each notification as a JSON line, and leave it unanswered."""
    print(json.dumps(asdict(notification)), flush=True)


def parse_value(text: str) -> Any:
    """`--set load=0.5` gives 0.5, `cgi=true` gives True, anything else stays text."""
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return value if isinstance(value, (bool, int, float)) else text


def parse_assignments(pairs: List[str]) -> Dict[str, Any]:
    values = {}
    for pair in pairs:
        name, sep, text = pair.partition("=")
        if not sep or not name:
            raise SystemExit(f"--set expects name=value, not {pair!r}")
        values[name] = parse_value(text)
    return values


COMMANDS = {
    "run": command_run,
    "check-config": command_check_config,
    "status": command_status,
    "session": command_session,
    "keygen": publisher.command_keygen,
    "publish": publisher.command_publish,
}
