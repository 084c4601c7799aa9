"""What the agent-side tests share: the socket URL, who issues their tokens, and
waiting for something the agents do in other processes."""

from __future__ import annotations

import time

from broker.audit import Actor

ISSUER = Actor("system", "tests")


def agent_url(base_url: str) -> str:
    """The agent socket of the test server at `base_url` (http://host:port)."""
    return base_url.replace("http://", "ws://") + "/ws/agent/v1/"


def wait_for(condition, what: str, timeout_s: float = 30.0) -> None:
    """Poll `condition` until it holds; fail naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting until {what}")
