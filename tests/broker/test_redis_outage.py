"""A Redis outage, on a Redis of the test's own that it kills and starts again: the
processes live through it, each says so in one line without a traceback, and an agent
that logs in meanwhile is told to try again (1013), never failed with 1011."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from broker import protocol
from launcher.embedded import EmbeddedRedis
from tests.broker.agent_helpers import agent_url, close_code, wait_for
from tests.cast import log_in_proved
from tests.conftest import ROOT, environment_for_test_database, stop_process

pytestmark = pytest.mark.django_db(transaction=True)

OUTAGE_LINE = "Redis cannot be reached"
OUTAGE_S = 8


@pytest.fixture
def private_redis():
    """A Redis of the test's own (the suite's is shared by every test)."""
    # A short folder: a Unix socket's path is limited to about 100 characters.
    server = EmbeddedRedis(Path(tempfile.mkdtemp(prefix="sn-outage-")) / "redis")
    server.start()
    try:
        yield server
    finally:
        server.stop()


def killed(server: EmbeddedRedis) -> None:
    """`server` killed, as a crash would, and gone."""
    server.process.kill()
    server.process.wait()


def said_once_without_a_traceback(log_path: Path) -> None:
    """The process's log tells the outage in one line, and no traceback."""
    text = log_path.read_text()
    assert "Traceback" not in text, text
    assert text.count(OUTAGE_LINE) == 1, text


def on_private_redis(server: EmbeddedRedis) -> dict[str, str]:
    """Every use of Redis on `server` (the tree's queues follow REDIS_URL)."""
    url = server.url()
    return {"REDIS_URL": url, "CHANNEL_LAYER_URL": url}


def log_in(ws, token: str) -> dict:
    """The first frame the server answers the login with."""
    ws.send(json.dumps({"type": "login", "token": token, "ref": "in"}))
    return json.loads(ws.recv(timeout=10))


def next_of_type(ws, kind: str) -> dict:
    while True:
        frame = json.loads(ws.recv(timeout=10))
        if frame["type"] == kind:
            return frame


def logs_in(url: str, token: str) -> bool:
    try:
        with connect(url, open_timeout=10) as ws:
            return log_in(ws, token)["type"] == "welcome"
    except (OSError, ConnectionClosed):
        return False


def nudged(page) -> None:
    """A frame through the channel layer, unless the page's socket noticed the outage
    by itself first and is already closing (either way it must close with 1013)."""
    with contextlib.suppress(ConnectionClosed):
        page.send(json.dumps({"type": "ping", "sent": 1}))


def console_socket(base_url: str, client, operator):
    """A console page's socket, of an operator who logged in."""
    log_in_proved(client, operator)
    cookie = f"sessionid={client.cookies['sessionid'].value}"
    headers = {"Cookie": cookie, "Origin": base_url}
    url = base_url.replace("http://", "ws://") + "/ws/console/"
    return connect(url, additional_headers=headers, open_timeout=10)


def test_through_a_redis_outage_a_web_process_answers_logins_1013_and_logs_one_line(
    cast, serve_console, private_redis, tmp_path, client, operator
):
    log_path = tmp_path / "web.log"
    with (
        open(log_path, "w") as log,
        serve_console(on_private_redis(private_redis), output=log) as base,
    ):
        url = agent_url(base)
        with (
            connect(url, open_timeout=10) as connected,
            console_socket(base, client, operator) as page,
        ):
            assert log_in(connected, cast["server"])["type"] == "welcome"
            killed(private_redis)

            nudged(page)
            assert close_code(page) == 1013  # the page's script connects again

            with connect(url, open_timeout=10) as during:
                refusal = log_in(during, cast["controller"])
                assert refusal["type"] == "error" and refusal["code"] == "internal"
                assert "Redis" in refusal["message"]
                assert close_code(during) == protocol.CLOSE_TRY_AGAIN_LATER == 1013
            connected.send(json.dumps({"type": "heartbeat", "ref": "hb"}))
            assert next_of_type(connected, "heartbeat")  # the session lives on
        # (its group could not be left as it closed: it expires)

        private_redis.start()
        wait_for(lambda: logs_in(url, cast["controller"]), "a login after Redis is back")
    said_once_without_a_traceback(log_path)


def test_a_quiet_console_page_is_closed_1013_when_redis_goes(
    cast, serve_console, private_redis, tmp_path, client, operator
):
    """The page sends nothing: it is its wait on its channel that meets the outage."""
    log_path = tmp_path / "web.log"
    with (
        open(log_path, "w") as log,
        serve_console(on_private_redis(private_redis), output=log) as base,
        console_socket(base, client, operator) as page,
    ):
        page.send(json.dumps({"type": "watch", "topics": ["fleet"]}))
        assert next_of_type(page, "watching")["topics"] == ["fleet"]
        killed(private_redis)
        assert close_code(page, timeout_s=30) == protocol.CLOSE_TRY_AGAIN_LATER
    said_once_without_a_traceback(log_path)


def test_a_redis_outage_kills_no_tree_worker_and_is_a_line_a_process(
    spawn_worker, private_redis, tmp_path
):
    env = on_private_redis(private_redis)
    log_path = tmp_path / "worker.log"
    with open(log_path, "w") as log:
        worker = spawn_worker(f"outage-{os.getpid()}", concurrency=2, env=env, output=log)
        try:
            a_worker_answers(env)
            killed(private_redis)
            wait_for(lambda: OUTAGE_LINE in log_path.read_text(), "the worker notices")
            time.sleep(OUTAGE_S)  # Celery's consumer tries to connect again meanwhile
            private_redis.start()
            a_worker_answers(env)
            assert worker.poll() is None, log_path.read_text()
        finally:
            stop_process(worker)
    text = log_path.read_text()
    assert "Traceback" not in text, text
    # The main process and its two pool processes (each routes hops) at most.
    assert 1 <= text.count(OUTAGE_LINE) <= 3, text


def a_worker_answers(env: dict[str, str]) -> None:
    """The console's health probe, run on the private Redis: a worker ran its task."""
    probe = (
        "import django; django.setup()\n"
        "from console.health import probe_celery_worker\n"
        "probe_celery_worker(timeout_s=60)"
    )
    environment = {**environment_for_test_database(), **env}
    done = subprocess.run(
        [sys.executable, "-c", probe], env=environment, cwd=ROOT, capture_output=True, timeout=120
    )
    assert done.returncode == 0, done.stderr.decode()
