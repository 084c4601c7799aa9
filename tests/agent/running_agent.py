"""An `sn-agent run` process in a folder of its own, and the commands the tests send
it, shared by the agent's tests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from broker.models import AttributeValue, Delivery
from broker.services.events import publish_event
from tests.broker.agent_helpers import wait_for

SERVER = "web-00000"
RECORD = """\
import json, os, sys
notification = json.load(sys.stdin)
with open(sys.argv[1], "a") as out:
    out.write(json.dumps({"event": os.environ["SN_EVENT_ID"], "position": os.environ["SN_POSITION"],
        "sender": os.environ["SN_SENDER"], "content": notification["content"],
        "home": os.environ.get("HOME")}) + "\\n")
print("recorded", os.environ["SN_EVENT_ID"])
"""


class RunningAgent:
    """An `sn-agent run` process and the folder it lives in."""

    def __init__(self, folder: Path, url: str, token: str) -> None:
        self.folder = folder
        self.ran = folder / "ran.jsonl"
        self.load = folder / "load"
        self.load.write_text("0.31\n")
        token_file = folder / "token"
        token_file.write_text(token)
        token_file.chmod(0o600)
        (folder / "record.py").write_text(RECORD)
        self.config = folder / "agent.toml"
        self.config.write_text(self.config_text(url))
        self.process: subprocess.Popen | None = None
        self.lines: list[dict] = []

    def config_text(self, url: str, *, timeout_s: int = 30) -> str:
        return f"""\
url = "{url}"
token_file = "token"
state_dir = "state"

[attributes]
hostname = "{SERVER}"
software = "IIS"
version = "2.4"
cgi = true

[providers.load]
file = "load"
field = 1
type = "float"
interval_s = 0.5

[actions.disable-cgi]
command = ["{sys.executable}", "record.py", "{self.ran}"]
cwd = "."
timeout_s = {timeout_s}

[actions.sleep]
command = ["sleep", "30"]
timeout_s = 1

[actions.slow]
command = ["sh", "-c", "sleep 2; echo finished"]
timeout_s = 30
"""

    def start(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "sn_agent", "run", "--config", str(self.config)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"},
        )  # fmt: skip

    def stop(self, signum: int = signal.SIGTERM) -> str:
        self.process.send_signal(signum)
        out, _ = self.process.communicate(timeout=30)
        return out

    def wait_until_an_action_runs(self) -> int:
        """The process group id of the action the agent is running, once it runs."""
        running = self.folder / "state" / "running"
        wait_for(lambda: any("started" in m.read_text() for m in running.glob("*.mark")),
                 "an action started")  # fmt: skip
        [mark] = [m for m in running.glob("*.mark") if "started" in m.read_text()]
        return int(mark.read_text().split()[1])

    def recorded(self) -> list[dict]:
        if not self.ran.exists():
            return []
        return [json.loads(line) for line in self.ran.read_text().splitlines()]


def command(web_server, action: str, lifetime_s: int = 300):
    scenario, _ = web_server
    return publish_event(
        sender=scenario.controllers["intellimune-national"],
        content={"kind": "command", "action": action},
        selector=f'receiver.hostname == "{SERVER}"',
        lifetime_s=lifetime_s,
        channel="commands",
    )


def answer_of(event) -> Delivery | None:
    delivery = Delivery.objects.filter(event=event).first()
    return delivery if delivery and delivery.state in ("acked", "failed") else None


def wait_answered(event, timeout_s: float = 30) -> Delivery:
    wait_for(lambda: answer_of(event) is not None, f"event {event.pk} was answered", timeout_s)
    return answer_of(event)


def load_of_server() -> float | None:
    value = AttributeValue.objects.filter(client__name=SERVER, name="load").first()
    return value.value if value else None
