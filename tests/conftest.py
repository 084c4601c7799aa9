"""Shared fixtures: the fixed cast, and real processes (ASGI server, Celery worker,
Chromium, Spark) running against the test database that pytest-django creates.

A test's tier follows from the fixtures it uses: one that needs a process of FULL_TIER
(directly or through another fixture) is marked with that kind and `full`, and runs in
the full tier only (`./test --all`); every other test runs in the fast tier (`./test`).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
from pytest_django.lazy_django import django_settings_is_configured

from launcher.supervisor import die_with_parent, listening_socket, web_server_argv
from tests.cast import ADMINISTRATOR, OPERATOR, create_member, log_in_proved

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
PROCESS_START_TIMEOUT_S = 30.0
# Workers started by the session fixture, so that other fixtures can tell.
RUNNING_WORKERS: list = []
# The fixtures that start a process of the full tier, and the kind of process (marker).
FULL_TIER = {
    "page": "browser",
    "asgi_server": "server",
    "serve_console": "server",
    "console_run": "server",
    "celery_worker": "worker",
    "spawn_worker": "worker",
    "reports_worker": "spark",
    "spark": "spark",
    "spark_in_a_process": "spark",  # tests/reports/conftest.py: a JVM of its own
    "cluster": "spark",  # tests/launcher/test_hosts.py: a Spark standalone cluster
    "deployment": "server",  # and its hosts
}


def pytest_collection_modifyitems(items) -> None:
    """Mark each test with the kinds of process its fixtures start, and `full` if any."""
    for item in items:
        kinds = sorted({FULL_TIER[name] for name in item.fixturenames if name in FULL_TIER})
        for kind in kinds:
            item.add_marker(kind)
        if kinds:
            item.add_marker("full")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def environment_for_test_database() -> dict[str, str]:
    """os.environ, with DATABASE_URL pointing at pytest-django's test database."""
    from django.db import connection

    env = dict(os.environ)
    parts = urlsplit(env["DATABASE_URL"])
    env["DATABASE_URL"] = urlunsplit(parts._replace(path="/" + connection.settings_dict["NAME"]))
    return env


def stop_process(process: subprocess.Popen) -> None:
    """Terminate it (kill it after 15 s), and close the pipes it wrote to."""
    process.terminate()
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    for pipe in (process.stdout, process.stderr):
        if pipe is not None:
            pipe.close()


def wait_for_http(url: str, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + PROCESS_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"server did not answer {url} in time")


@contextmanager
def console_serving(env: dict[str, str] | None = None, *, output=None) -> Iterator[str]:
    """A real web process serving the console (HTTP and WebSocket), started as the
    launcher starts one (its listening socket made here), on a free port, with `env`
    added to its environment (and its output written to the file `output`, if given);
    yields its base URL."""
    listener = listening_socket("127.0.0.1", 0)
    port = listener.getsockname()[1]
    environment = {**environment_for_test_database(), **(env or {})}
    # It dies with the test process, so that no server outlives an interrupted run.
    process = subprocess.Popen(
        web_server_argv(listener),
        env=environment,
        cwd=ROOT,
        pass_fds=(listener.fileno(),),
        preexec_fn=die_with_parent,
        stdout=output,
        stderr=output,
    )
    listener.close()  # the server holds its own copy
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_for_http(f"{base_url}/login/", process)
        yield base_url
    finally:
        stop_process(process)


@pytest.fixture(scope="session")
def serve_console():
    """`console_serving`, for a test or fixture that needs a web process of its own
    (with settings of its own): `with serve_console({"NAME": "value"}) as base_url:`."""
    return console_serving


@pytest.fixture(scope="session")
def asgi_server(django_db_setup, django_db_blocker) -> str:
    """A real web process serving the console, shared by the tests that need one."""
    with console_serving() as base_url:
        yield base_url


class WorkerProcess:
    """A real Celery worker process serving the whole tree, which tests may kill."""

    def __init__(self, name: str, *, env: dict[str, str] | None = None) -> None:
        self.name = name
        self.env = env or {}
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        self.process = start_worker(self.name, env=self.env)
        wait_for_worker(self.process)

    def kill_hard(self) -> None:
        """SIGKILL the worker and its pool processes, as a crash would."""
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            stop_process(self.process)


@pytest.fixture(scope="session")
def celery_worker(django_db_setup, django_db_blocker) -> WorkerProcess:
    """A real Celery worker on the test database, shared by the tests that need one."""
    worker = WorkerProcess(f"test-{os.getpid()}")
    with django_db_blocker.unblock():
        worker.start()
    RUNNING_WORKERS.append(worker)
    try:
        yield worker
    finally:
        RUNNING_WORKERS.remove(worker)
        worker.stop()


@pytest.fixture(scope="session")
def spawn_worker():
    """`start_worker`, for a test that needs a worker of its own (with settings of its
    own): `process = spawn_worker("name", env={...})`; the test stops it."""
    return start_worker


@pytest.fixture(scope="session")
def spark():
    """The process's SparkSession (local), started once for the whole run."""
    from reports import spark as reports_spark

    return reports_spark.session()


@pytest.fixture(scope="session")
def reports_dataset(tmp_path_factory) -> Path:
    """The Parquet dataset folder of the session's reports worker (a test that exports
    from its own process must point REPORTS_DATASET here too)."""
    return tmp_path_factory.mktemp("reports") / "dataset"


@pytest.fixture(scope="session")
def reports_worker(django_db_setup, django_db_blocker, reports_dataset) -> subprocess.Popen:
    """A real reports worker (the launcher's: the reports queue alone, solo pool, Spark
    warmed as it starts) on the test database and the session's dataset folder."""
    from launcher.__main__ import reports_worker_argv
    from reports import QUEUE as REPORTS_QUEUE

    env = {**environment_for_test_database(), "REPORTS_DATASET": str(reports_dataset)}
    process = subprocess.Popen(
        reports_worker_argv(hostname=f"reports-test-{os.getpid()}@%h"),
        env=env,
        cwd=ROOT,
        start_new_session=True,
        preexec_fn=die_with_parent,
    )
    try:
        with django_db_blocker.unblock():
            wait_for_worker(process, queue=REPORTS_QUEUE)
        yield process
    finally:
        stop_process(process)


def worker_queues() -> str:
    """The default queue and every dispatcher queue of the configured tree."""
    from django.conf import settings

    from broker.dispatch.queues import dispatcher_queues

    queues = dispatcher_queues(settings.TREE_DEPTH, settings.TREE_BRANCHING)
    return ",".join([settings.CELERY_TASK_DEFAULT_QUEUE, *queues])


def start_worker(
    name: str, *, concurrency: int = 2, env: dict[str, str] | None = None, output=None
) -> subprocess.Popen:
    """Start a real Celery worker process serving the whole tree on the test database
    (with `env` added to its environment, its output written to the file `output` if
    given)."""
    argv = [
        str(BIN / "celery"), "-A", "console", "worker", "--loglevel", "WARNING",
        "--concurrency", str(concurrency), "--without-gossip", "--without-mingle",
        "--without-heartbeat", "--hostname", f"{name}@%h", "--queues", worker_queues(),
    ]  # fmt: skip
    # Its own session, so that a test can kill the pool's processes with it; it dies
    # with the test process, so that no worker outlives an interrupted run.
    return subprocess.Popen(
        argv,
        env={**environment_for_test_database(), **(env or {})},
        cwd=ROOT,
        start_new_session=True,
        preexec_fn=die_with_parent,
        stdout=output,
        stderr=output,
    )


def wait_for_worker(process: subprocess.Popen, *, queue: str | None = None) -> None:
    """Wait until the worker runs a task from `queue` (the default queue if None)."""
    from console.health import probe_celery_worker

    deadline = time.monotonic() + PROCESS_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"celery worker exited with {process.returncode}")
        try:
            probe_celery_worker(queue=queue, timeout_s=1)
            return
        except TimeoutError:
            continue
    raise RuntimeError("celery worker did not answer in time")


@pytest.fixture
def operator(django_user_model):
    """Olivia, an operator without admin rights."""
    return create_member(OPERATOR)


@pytest.fixture
def admin_user(db):
    """Adam, the administrator, as pytest-django's `admin_client` logs in (its own
    admin_user hashes a password for every test that uses it)."""
    return create_member(ADMINISTRATOR)


@pytest.fixture
def admin_client(client, admin_user):
    """pytest-django's admin_client, with the administrator's second factor proved."""
    return log_in_proved(client, admin_user)


@pytest.fixture(scope="session", autouse=True)
def no_lingering_connections_in_the_test_process():
    """Threads of this process (async helpers) open connections of their own that no
    one closes; kept for DATABASE_CONN_MAX_AGE_S they would stop PostgreSQL from
    dropping the test database. Servers and workers, separate processes, keep theirs."""
    if not django_settings_is_configured():
        return  # pure tests: no Django here
    from django.db import connections

    for alias in connections.settings:
        connections.settings[alias]["CONN_MAX_AGE"] = 0
    for connection in connections.all(initialized_only=True):
        connection.settings_dict["CONN_MAX_AGE"] = 0


@pytest.fixture(scope="session", autouse=True)
def close_audit_connection(request):
    """The `audit` alias has a connection of its own: close it before the test
    database is dropped, or PostgreSQL refuses to drop a database in use."""
    if not django_settings_is_configured():
        yield  # pure tests: no Django here
        return
    django_db_blocker = request.getfixturevalue("django_db_blocker")
    request.getfixturevalue("django_db_setup")
    yield
    from django.db import connections

    with django_db_blocker.unblock():
        connections["audit"].close()


@pytest.fixture(scope="session", autouse=True)
def databases_emptied_quickly_after_transactional_tests():
    """Each transactional test's databases are emptied as a flush would leave them,
    in a third of the time (tests/database_reset.py)."""
    if django_settings_is_configured():
        from tests import database_reset

        database_reset.install()
    yield


@pytest.fixture(autouse=True)
def no_api_lockout_left_by_an_earlier_test():
    """Unknown tokens are counted per address in Redis, which outlives each test's
    database: an earlier test's (a fuzzer's) must not lock this one out."""
    if not django_settings_is_configured():
        yield
        return
    from django.core.cache import cache

    from broker.api import token_failures_key

    cache.delete(token_failures_key("127.0.0.1"))
    yield


@pytest.fixture(autouse=True)
def quiet_tree_before_flush(request):
    """After a test that committed data, let the worker finish what it caused before
    the tables are truncated: a task still running would deadlock the flush (its
    teardown runs before the database helper's, which it comes after)."""
    if django_settings_is_configured():
        request.getfixturevalue("_django_db_helper")
    yield
    marker = request.node.get_closest_marker("django_db")
    if RUNNING_WORKERS and marker and marker.kwargs.get("transaction"):
        from tests.broker.tree_helpers import wait_until_idle

        wait_until_idle(timeout_s=60)


@pytest.fixture(autouse=True)
def no_signing_key_left_by_an_earlier_test():
    """The console's key folder outlives each test's database: a key made by an earlier
    test would not match the public key of this test's client of the same name."""
    folder = os.environ.get("SIGNING_KEYS_DIR")
    if folder:
        for kind in ("senders", "authorities"):
            shutil.rmtree(Path(folder) / kind, ignore_errors=True)
    yield
