"""Signed events from a script (docs/agent.md, "Publishing signed events from a
script"): `sn-agent keygen` and `sn-agent publish` run from a shell script, and the
docs' Python example over the HTTP API, against a real Uvicorn and Celery worker, to an
agent that verifies signatures and acts."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import call_command

from broker.models import Client, Event
from broker.services.clients import issue_token
from tests.agent.running_agent import SERVER, wait_answered
from tests.broker.agent_helpers import ISSUER

SENDER = "intellimune-national"
COMMAND = '{"kind": "command", "action": "disable-cgi"}'
PUBLISH = f"""\
#!/bin/sh
# A SOAR tool's step: sign with the sender's own key, publish, keep the event's id.
set -eu
sn-agent publish "$CONSOLE" --token-file "$HERE/token" --key-file "$HERE/sender.pem" \\
    --content '{COMMAND}' --selector 'receiver.hostname == "{SERVER}"' \\
    --channel commands --lifetime 300 > "$HERE/published.json"
"""


def without_django() -> dict[str, str]:
    bin_folder = str(Path(sys.executable).parent)  # where sn-agent is installed
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    return {**env, "PATH": f"{bin_folder}:{env.get('PATH', '')}"}


def sn_agent(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["sn-agent", *args], env={**without_django(), **(env or {})},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def own_key(folder: Path) -> None:
    """The sender's key pair made by `sn-agent keygen`, its public half registered on
    the console as the docs say (`manage.py signing_key sender NAME --public-key`)."""
    made = sn_agent("keygen", "--out", str(folder / "sender.pem"))
    assert made.returncode == 0, made.stderr
    call_command("signing_key", "sender", SENDER, "--public-key", made.stdout.strip())


def private(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o600)


@pytest.mark.django_db(transaction=True)
def test_a_shell_script_signs_and_publishes_with_the_documented_command_and_the_agent_acts(
    agent, web_server, tmp_path
):
    agent.start()
    scenario, _ = web_server
    own_key(tmp_path)
    private(tmp_path / "token", issue_token(client=scenario.controllers[SENDER], actor=ISSUER))
    script = tmp_path / "publish.sh"
    script.write_text(PUBLISH)

    done = subprocess.run(
        ["sh", str(script)], env={**without_django(), "CONSOLE": agent.url, "HERE": str(tmp_path)},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip

    assert done.returncode == 0, done.stderr
    published = json.loads((tmp_path / "published.json").read_text())
    event = Event.objects.get(pk=published["event"])
    assert event.seal["key"] == Client.objects.get(name=SENDER).signing_key  # its own key
    assert wait_answered(event).state == "acked"
    assert [r["event"] for r in agent.recorded()] == [str(event.pk)]


@pytest.mark.django_db(transaction=True)
def test_the_docs_python_example_signs_and_posts_over_the_http_api_and_the_agent_acts(
    agent, web_server, asgi_server, tmp_path
):
    agent.start()
    scenario, _ = web_server
    own_key(tmp_path)
    private(tmp_path / "token", issue_token(client=scenario.controllers[SENDER], actor=ISSUER))
    (tmp_path / "example.py").write_text(docs_python_example(asgi_server, tmp_path))

    done = subprocess.run(
        [sys.executable, str(tmp_path / "example.py")], env=without_django(),
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip

    assert done.returncode == 0, done.stderr
    event = Event.objects.get(pk=ast.literal_eval(done.stdout)["event"])  # printed: a dict
    assert wait_answered(event).state == "acked"
    assert [r["event"] for r in agent.recorded()] == [str(event.pk)]


def docs_python_example(base_url: str, folder: Path) -> str:
    """The Python example of docs/agent.md, sending web-00000 a command from this test's
    sender, to this test's console."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "agent.md").read_text()
    section = doc.split("## Publishing signed events from a script", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    return (
        code.replace("https://console.example.com", base_url)
        .replace("/etc/soar/sender.pem", str(folder / "sender.pem"))
        .replace("/etc/soar/token", str(folder / "token"))
        .replace('"northwest-controller"', f'"{SENDER}"')
        .replace('{"kind": "alert", "alert": "worm", "threat_level": 4}', COMMAND)
        .replace("'receiver.region == \"Northwest\"'", f"'receiver.hostname == \"{SERVER}\"'")
        .replace('"channel": "alerts"', '"channel": "commands"')
    )


def test_keygen_never_replaces_a_key_file(tmp_path):
    key = tmp_path / "sender.pem"
    first = sn_agent("keygen", "--out", str(key))
    kept = key.read_bytes()
    again = sn_agent("keygen", "--out", str(key))

    assert first.returncode == 0 and first.stdout.startswith("ed25519:")
    assert oct(key.stat().st_mode & 0o777) == "0o600"
    assert again.returncode == 2 and "exists: a key file is never replaced" in again.stderr
    assert key.read_bytes() == kept


def test_publish_refuses_a_key_file_others_can_read_and_content_that_is_no_object(tmp_path):
    key = tmp_path / "sender.pem"
    sn_agent("keygen", "--out", str(key))
    key.chmod(0o644)
    args = ("publish", "ws://127.0.0.1:9/ws/agent/v1/", "--key-file", str(key))
    opened = sn_agent(*args, "--content", "{}", env={"SN_TOKEN": "snt_x"})
    key.chmod(0o600)
    listed = sn_agent(*args, "--content", "[1]", env={"SN_TOKEN": "snt_x"})
    no_token = sn_agent(*args, "--content", "{}")

    assert opened.returncode == 2 and "open to its group or to others" in opened.stderr
    assert listed.returncode == 2 and "--content: expected a JSON object" in listed.stderr
    assert no_token.returncode == 2 and "a token is needed" in no_token.stderr
