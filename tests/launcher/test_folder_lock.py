"""A data folder has one owner: a second `./run` or `launcher services` on a folder in
use says which process holds it and exits, touching nothing of the first's; the lock
ends with its holder, however it dies. Test runs share their folder with one another.

Real processes on temporary folders: the test session's own var/test is never used."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psycopg
import pytest
import redis

from launcher.embedded import process_alive
from launcher.folder_lock import FolderInUse, hold_alone, hold_shared, holder_description
from tests.conftest import free_port
from tests.launcher.process_output import ProcessOutput

ROOT = Path(__file__).resolve().parents[2]
SERVICES_START_TIMEOUT_S = 120.0
REFUSED_WITHIN_S = 30.0
STARTED = r"started \d{4}-\d\d-\d\d \d\d:\d\d:\d\d"


def without_servers() -> dict[str, str]:
    """This environment, with no server given: a launcher would start or adopt the
    private ones in its data folder."""
    names = ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL", "CHANNEL_LAYER_URL")
    return {k: v for k, v in os.environ.items() if k not in names}


def launcher(*args: str) -> ProcessOutput:
    process = subprocess.Popen(
        [sys.executable, "-m", "launcher", *args],
        cwd=ROOT, env=without_servers(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    return ProcessOutput(process)


def refused(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "launcher", *args], cwd=ROOT, env=without_servers(),
        capture_output=True, text=True, timeout=REFUSED_WITHIN_S,
    )  # fmt: skip


def as_typed(folder: Path) -> str:
    """A data folder as the launcher, run from the checkout, names it."""
    return str(folder.relative_to(ROOT)) if folder.is_relative_to(ROOT) else str(folder)


def servers_of(folder: Path) -> tuple[int, int]:
    """(Redis's pid, PostgreSQL's pid) of the private servers in `folder`, both answering."""
    client = redis.Redis(unix_socket_path=str(folder / "redis" / "redis.sock"))
    redis_pid = int(client.info("server")["process_id"])
    postgres_pid = int((folder / "postgres" / "postmaster.pid").read_text().split()[0])
    url = f"postgresql://postgres@/console?host={folder / 'postgres'}"
    with psycopg.connect(url) as connection:
        connection.execute("SELECT 1")
    return redis_pid, postgres_pid


@pytest.fixture
def holder(tmp_path):
    """`launcher services` holding a temporary data folder, its servers running."""
    folder = tmp_path / "data"
    output = launcher("services", "--data-dir", str(folder))
    try:
        output.wait_for(r"^export REDIS_URL=", timeout_s=SERVICES_START_TIMEOUT_S)
        yield output, folder
    finally:
        stop_whatever_holds(output, folder)


def stop_whatever_holds(output: ProcessOutput, folder: Path) -> None:
    """Stop the holder; if it was killed, its servers were left running: a launcher
    that adopts and stops them (the folder being free again) cleans up."""
    if output.process.poll() is None:
        output.process.send_signal(signal.SIGTERM)
        output.process.wait(timeout=60)
        return
    cleaner = launcher("services", "--data-dir", str(folder))
    cleaner.wait_for(r"^export REDIS_URL=", timeout_s=SERVICES_START_TIMEOUT_S)
    cleaner.process.send_signal(signal.SIGTERM)
    assert cleaner.process.wait(timeout=60) == 0


def test_a_second_run_on_a_folder_in_use_says_who_holds_it_and_touches_nothing(holder):
    output, folder = holder
    before = servers_of(folder)
    port = free_port()

    done = refused("run", "--data-dir", str(folder), "--port", str(port), "--fleet", "2")

    holder_pid = output.process.pid
    assert done.returncode == 1
    assert done.stderr == ""
    assert re.fullmatch(
        rf"\[launcher\] the data folder {re.escape(as_typed(folder))} is in use by "
        rf"python -m launcher services \(pid {holder_pid}, {STARTED}\); "
        r"stop it first or use --data-dir\n",
        done.stdout,
    ), done.stdout
    # The first's servers were neither stopped nor restarted; nothing was started.
    time.sleep(1)
    assert servers_of(folder) == before
    assert output.process.poll() is None
    assert output.matching(r"^\[launcher\]") == [
        f"[launcher] starting private PostgreSQL in {folder / 'postgres'}",
        f"[launcher] starting private Redis in {folder / 'redis'}",
    ]


def test_a_second_services_on_a_folder_in_use_is_refused_too(holder):
    output, folder = holder

    done = refused("services", "--data-dir", str(folder))

    assert done.returncode == 1
    assert f"is in use by python -m launcher services (pid {output.process.pid}" in done.stdout
    assert "export" not in done.stdout


def test_the_folder_is_free_once_its_holder_is_killed_and_its_servers_are_adopted(holder):
    output, folder = holder
    left_running = servers_of(folder)

    output.process.kill()
    output.process.wait(timeout=10)

    lock = hold_alone(folder, holder_description("this test"))
    lock.release()
    # Its servers outlive it (their own sessions): the next holder adopts them.
    assert all(process_alive(pid) for pid in left_running)
    assert servers_of(folder) == left_running


def test_the_folder_names_a_run_that_holds_it(tmp_path):
    folder = tmp_path / "demo"
    run = hold_in_a_process(folder, "./run")
    try:
        done = refused("run", "--data-dir", str(folder), "--fleet", "1")
        assert done.returncode == 1
        assert f"is in use by ./run (pid {run.pid}, " in done.stdout
        assert not (folder / "postgres").exists() and not (folder / "secret_key").exists()
    finally:
        run.kill()
        run.wait()


HOLD = """
import sys, time
from pathlib import Path
from launcher.folder_lock import hold_alone, hold_shared, holder_description
folder, command, how = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
if how == "alone":
    hold_alone(folder, holder_description(command))
else:
    hold_shared(folder, holder_description(command), wait_s=0)
print("held", flush=True)
time.sleep(600)
"""


def hold_in_a_process(folder: Path, command: str, how: str = "alone") -> subprocess.Popen:
    """A process holding `folder`'s lock as `command` would, until killed."""
    process = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(HOLD), str(folder), command, how],
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert process.stdout.readline() == "held\n"
    return process


def test_test_runs_share_a_folder_and_the_last_one_out_holds_it_alone(tmp_path):
    other_run = hold_in_a_process(tmp_path, "a test run", how="shared")
    try:
        this_run = hold_shared(tmp_path, holder_description("a test run"), wait_s=0)
        with pytest.raises(FolderInUse, match="is in use by a test run"):
            hold_alone(tmp_path, holder_description("./run"))
        assert not this_run.take_alone()  # the other still runs: it stops the servers
        this_run.release()
    finally:
        other_run.kill()
        other_run.wait()
    last_run = hold_shared(tmp_path, holder_description("a test run"), wait_s=0)
    assert last_run.take_alone()
    last_run.release()


def test_a_test_run_waits_for_a_run_holding_its_folder_then_says_who(tmp_path):
    run = hold_in_a_process(tmp_path, "./run")
    try:
        started = time.monotonic()
        said = rf"in use by \./run \(pid {run.pid}, .*; stop it first$"
        with pytest.raises(FolderInUse, match=said):
            hold_shared(tmp_path, holder_description("a test run"), wait_s=0.5)
        assert time.monotonic() - started >= 0.5
    finally:
        run.kill()
        run.wait()
