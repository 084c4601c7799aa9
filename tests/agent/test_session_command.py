"""`sn-agent session`, one session opened by hand as an operator runs it: a separate
process without Django, against a real Uvicorn and a real Celery worker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from broker.models import Delivery
from broker.services.clients import issue_token
from demo.scenario import load_scenario
from tests.broker.agent_helpers import ISSUER, agent_url, wait_for
from tests.broker.tree_helpers import wait_until_idle

pytestmark = pytest.mark.django_db(transaction=True)

SELECTOR = 'receiver.software == "IIS"'


def without_django() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}


def cli(*args: str, token: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "sn_agent", "session", *args],
        env={**without_django(), "SN_TOKEN": token},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.fixture
def tokens(celery_worker):
    scenario = load_scenario(servers=2)
    wait_until_idle()
    server = next(s for s in scenario.servers if s.name == "web-00000")
    national = scenario.controllers["intellimune-national"]
    return issue_token(client=server, actor=ISSUER), issue_token(client=national, actor=ISSUER)


def test_the_agent_imports_without_django_or_settings():
    code = "import sys, sn_agent.cli, sn_agent.service; print('django' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", code], env=without_django(), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_a_listening_session_prints_each_notification_and_confirms_it(asgi_server, tokens):
    server_token, controller_token = tokens
    url = agent_url(asgi_server)
    listener = cli(url, "--set", "load=0.3", "--listen", token=server_token)
    try:
        time.sleep(1.5)  # logged in and listening
        publisher = cli(
            url, "--publish", '{"kind": "command", "action": "disable-cgi"}',
            "--selector", SELECTOR, "--lifetime", "300", token=controller_token,
        )  # fmt: skip
        out, err = publisher.communicate(timeout=30)
        assert publisher.returncode == 0, err
        published = json.loads(out)
        printed = json.loads(listener.stdout.readline())
        wait_for(lambda: confirmed(printed["delivery"]), "the delivery was confirmed", 20)
    finally:
        listener.terminate()
        listener.wait(timeout=10)
    assert printed["event"] == published["event"] and printed["content"]["action"] == "disable-cgi"


def confirmed(delivery_id: int) -> bool:
    return Delivery.objects.get(pk=delivery_id).state == "delivered"


def test_a_refused_request_prints_the_error_frame_and_exits_non_zero(asgi_server, tokens):
    server_token, _ = tokens
    done = cli(agent_url(asgi_server), "--set", "region=Northwest", token=server_token)
    _, err = done.communicate(timeout=30)
    assert done.returncode == 1
    error = json.loads(err.strip().splitlines()[-1])["error"]
    assert (error["code"], error["field"]) == ("not_authorised", "values.region")


def test_a_bad_token_ends_with_a_clear_message(asgi_server, tokens):
    done = cli(agent_url(asgi_server), "--listen", token="snt_wrong")
    _, err = done.communicate(timeout=30)
    assert done.returncode == 1
    assert "authentication_failed" in err
