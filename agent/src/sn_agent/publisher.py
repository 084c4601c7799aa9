"""Signed events from a script: `sn-agent keygen` makes a sender's key pair, and
`sn-agent publish` signs an event with it and publishes it (docs/agent.md, "Publishing
signed events from a script"). Agents that verify act only on events their sender
signed; a sender that keeps its own key signs here, and the console holds only the
public half.

    sn-agent keygen --out /etc/soar/sender.pem
    sn-agent publish wss://console/ws/agent/v1/ --token-file /etc/soar/token \\
        --key-file /etc/soar/sender.pem --content '{"kind": "command", "action": "status"}' \\
        --selector 'receiver.region == "Northwest"' --channel commands --lifetime 600
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import stat
import sys
from pathlib import Path
from typing import Any, Dict

from sn_agent import signatures
from sn_agent.client import Agent, AgentError, SessionEnded
from sn_agent.config import ConfigError, read_token

# What `publish` ends with when the console refuses (the error frame is printed), and
# when it cannot be asked (a file, the token, the connection).
REFUSED, UNUSABLE = 1, 2


class Unusable(Exception):
    """What stops `publish` before the console is asked: said with where."""


def add_parsers(commands) -> None:
    """The `keygen` and `publish` commands."""
    keygen = commands.add_parser("keygen", help="make a sender's signing key pair")
    keygen.add_argument("--out", required=True, metavar="FILE", help="the private key (PEM)")
    publish = commands.add_parser("publish", help="sign an event with a key file and publish it")
    publish.add_argument("url", help="the console's agent socket: wss://HOST/ws/agent/v1/")
    publish.add_argument("--token-file", metavar="FILE", help="the sender's token (or SN_TOKEN)")
    publish.add_argument("--key-file", required=True, metavar="FILE", help="from sn-agent keygen")
    publish.add_argument("--content", required=True, metavar="JSON", help="a JSON object")
    publish.add_argument("--selector", default="")
    publish.add_argument("--lifetime", type=int, default=60, metavar="SECONDS")
    publish.add_argument("--channel", default="default")
    publish.add_argument("--idempotency-key", help="publishing again returns the first event")


def command_keygen(args: argparse.Namespace) -> int:
    """Write a new private key to --out (never over an existing file) and print its
    public key, to register with `manage.py signing_key sender NAME --public-key`."""
    key = signatures.new_private_key()
    try:
        descriptor = os.open(args.out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return _unusable(f"{args.out} exists: a key file is never replaced; move it aside first")
    except OSError as error:
        return _unusable(f"cannot write {args.out}: {error.strerror}")
    with os.fdopen(descriptor, "wb") as file:
        file.write(signatures.private_key_pem(key))
    print(signatures.public_key_text(key.public_key()))
    print(
        "register it on the console: manage.py signing_key sender NAME --public-key KEY",
        file=sys.stderr,
    )
    return 0


def command_publish(args: argparse.Namespace) -> int:
    """Sign the event with the key file and publish it; print {event, channel,
    sequence}. A refusal prints the console's error frame."""
    try:
        token, key, content = _token(args), _signing_key(args.key_file), _content(args.content)
    except (Unusable, ConfigError) as error:
        return _unusable(str(error))
    try:
        published = asyncio.run(_publish(args, token, key, content))
    except AgentError as error:
        print(json.dumps({"error": error.frame}), file=sys.stderr)
        return REFUSED
    except SessionEnded as ended:
        return _unusable(f"the console refused the token: {ended}")
    except (OSError, asyncio.TimeoutError) as error:
        return _unusable(f"cannot reach {args.url}: {error}")
    print(json.dumps({k: published[k] for k in ("event", "channel", "sequence")}), flush=True)
    return 0


async def _publish(args: argparse.Namespace, token: str, key, content: Dict[str, Any]) -> dict:
    agent = Agent(args.url, token)
    await agent.connect()
    try:
        return await agent.publish(
            content,
            selector=args.selector,
            lifetime_s=args.lifetime,
            channel=args.channel,
            idempotency_key=args.idempotency_key,
            signing_key=key,
        )
    finally:
        await agent.close()


def _token(args: argparse.Namespace) -> str:
    if args.token_file:
        return read_token(Path(args.token_file))
    token = os.environ.get("SN_TOKEN", "").strip()
    if not token:
        raise Unusable("a token is needed: --token-file FILE, or SN_TOKEN")
    return token


def _signing_key(path_text: str):
    """The private key in `path_text`, refused when others may read it."""
    path = Path(path_text)
    try:
        mode = path.stat().st_mode
        data = path.read_bytes()
    except OSError as error:
        raise Unusable(f"--key-file: cannot read {path}: {error.strerror}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise Unusable(
            f"--key-file: {path} is open to its group or to others; run: chmod 600 {path}"
        )
    try:
        return signatures.private_key_from_pem(data)
    except (ValueError, TypeError) as error:
        raise Unusable(f"--key-file: {path} holds no Ed25519 private key ({error})") from None


def _content(text: str) -> Dict[str, Any]:
    try:
        content = json.loads(text)
    except ValueError as error:
        raise Unusable(f"--content: not JSON: {error}") from None
    if not isinstance(content, dict):
        raise Unusable('--content: expected a JSON object, such as {"kind": "alert"}')
    return content


def _unusable(message: str) -> int:
    print(f"sn-agent: {message}", file=sys.stderr)
    return UNUSABLE
