"""An `sn-agent run` process in a folder of its own, and the commands the tests send
it, shared by the agent's tests."""

from __future__ import annotations

import getpass
import json
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

from sn_agent.journal import Journal

from broker.models import AttributeValue, Delivery
from broker.services.clients import issue_token
from broker.services.events import publish_event
from broker.services.signing_keys import make_authority_key, make_sender_key
from demo.scenario import WEB_SERVER_POLICY
from tests.broker.agent_helpers import ISSUER, agent_url, wait_for

SERVER = "web-00000"
# The senders whose keys the console holds, so that their sends are signed.
SIGNING_SENDERS = ("intellimune-national", "northwest-controller")
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
    """An `sn-agent run` process and the folder it lives in. With an `authority_key`
    it verifies ([trust], as docs/agent.md installs it), checking events against the
    scenario's web server policy."""

    def __init__(self, folder: Path, url: str, token: str, *, authority_key: str = "") -> None:
        self.folder = folder
        self.url = url
        self.authority_key = authority_key
        (folder / "policy").write_text(WEB_SERVER_POLICY)
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
        self.log = folder / "agent.log"
        self.log_offset = 0
        self.lines: list[dict] = []

    def config_text(self, url: str, *, timeout_s: int = 30) -> str:
        return f"""\
url = "{url}"
token_file = "token"
state_dir = "state"
policy_file = "policy"
# The actions write into this test's folder, which only its owner may enter.
action_user = "{getpass.getuser()}"
{self.trust_text()}
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

[actions.noop]
command = ["true"]
"""

    def trust_text(self) -> str:
        if not self.authority_key:
            return ""
        return f'[trust]\nauthorities = {{ trust-manager = ["{self.authority_key}"] }}\n'

    def start(self, program: list | None = None) -> None:
        """Start the agent (`program`: an installed `sn-agent`), and wait until it is
        logged in: a command signed before a new journal began is refused
        (docs/security.md, "Replays"). Its output goes to `agent.log` in its folder:
        a pipe nobody reads while it runs would stop it once full."""
        program = program or [sys.executable, "-m", "sn_agent"]
        self.log_offset = self.log.stat().st_size if self.log.exists() else 0
        with open(self.log, "a") as log:
            self.process = subprocess.Popen(
                [*map(str, program), "run", "--config", str(self.config)],
                stdout=log, stderr=subprocess.STDOUT,
                env={k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"},
            )  # fmt: skip
        wait_for(self.connected, "the agent logged in")

    def connected(self) -> bool:
        """Whether the agent's journal says it is logged in (or its process ended)."""
        if self.process.poll() is not None:
            return True  # the test reads why from its output
        journal = self.folder / "state" / "journal.sqlite3"
        return journal.exists() and bool(state_facts(self.folder / "state").get("connected"))

    def stop(self, signum: int = signal.SIGTERM) -> str:
        """Stop the agent with `signum`; what it wrote since it was started."""
        self.process.send_signal(signum)
        self.process.wait(timeout=30)
        return self.output()

    def output(self) -> str:
        """What the agent wrote since it was last started."""
        with open(self.log) as log:
            log.seek(self.log_offset)
            return log.read()

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


def verifying_agent(folder: Path, asgi_server, web_server) -> RunningAgent:
    """web-00000's agent trusting the trust manager's key; the console holds that key
    and the signing senders', so that operators' sends to it are signed."""
    scenario, server = web_server
    authority_key = make_authority_key(authority=scenario.trust_manager, actor=ISSUER)
    for sender in SIGNING_SENDERS:
        make_sender_key(client=scenario.controllers[sender], actor=ISSUER)
    token = issue_token(client=server, actor=ISSUER)
    return RunningAgent(folder, agent_url(asgi_server), token, authority_key=authority_key)


def state_facts(state_dir: Path) -> dict:
    """The facts an agent's journal keeps (connected, pid...), read as `status` does."""
    journal = Journal(state_dir, read_only=True)
    try:
        return journal.facts()
    except sqlite3.OperationalError:  # being created
        return {}
    finally:
        journal.db.close()


def command(web_server, action: str, lifetime_s: int = 300, *, signed: bool = True):
    """A command to web-00000 as an operator's send publishes it: signed by the console
    (or, `signed=False`, as a stolen sender token or the API unsigned would)."""
    scenario, _ = web_server
    return publish_event(
        sender=scenario.controllers["intellimune-national"],
        content={"kind": "command", "action": action},
        selector=f'receiver.hostname == "{SERVER}"',
        lifetime_s=lifetime_s,
        channel="commands",
        console_signs=signed,
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
