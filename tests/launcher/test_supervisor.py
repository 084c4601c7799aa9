"""The supervisor restarts what dies, with a growing delay it logs, and stops on request
even while a restart is pending. Real processes: a launcher-like driver process runs the
Supervisor over real children, and the tests kill them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from launcher.embedded import process_alive
from launcher.supervisor import STABLE_AFTER_S, Backoff, Supervisor
from tests.launcher.process_output import ProcessOutput

ROOT = Path(__file__).resolve().parents[2]
# A launcher in miniature: the real Supervisor, real signal handling, real children.
DRIVER = """
import os, sys
from launcher.supervisor import Supervisor
supervisor = Supervisor(max_delay_s=float(sys.argv[1]))
supervisor.install_signal_handlers()
for name, code in zip(sys.argv[2::2], sys.argv[3::2]):
    supervisor.start(name, [sys.executable, "-c", code], dict(os.environ))
supervisor.wait()
supervisor.stop_all()
print("[driver] stopped", flush=True)
"""
SLEEPS = "import time; time.sleep(600)"
EXITS_AT_ONCE = "import sys; sys.exit(3)"
STARTED = r"{} started \(pid (\d+)\)"
RESTARTED = r"{} restarted \(pid (\d+)\)"


@pytest.fixture
def drive():
    """Start a driver supervising (name, code) children; stop it after the test."""
    drivers: list[subprocess.Popen] = []

    def start(*children: tuple[str, str], max_delay_s: float = 30.0) -> ProcessOutput:
        argv = [sys.executable, "-c", DRIVER, str(max_delay_s)]
        for name, code in children:
            argv += [name, code]
        process = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        drivers.append(process)
        return ProcessOutput(process)

    yield start
    for process in drivers:
        if process.poll() is None:
            process.terminate()
            process.wait(timeout=30)


def pid_of(output: ProcessOutput, pattern: str, *, after: int = 0) -> int:
    return int(output.wait_for(pattern, timeout_s=15, after=after)[1])


def test_a_killed_child_is_restarted_after_one_second_then_two_and_each_death_is_logged(
    drive,
):
    output = drive(("sleeper", SLEEPS))
    first = pid_of(output, STARTED.format("sleeper"))

    killed_at = time.monotonic()
    os.kill(first, signal.SIGKILL)
    output.wait_for(
        r"^\[launcher\] sleeper exited \(signal SIGKILL\); restarting in 1\.0 s, restart 1$",
        timeout_s=5,
    )
    second = pid_of(output, RESTARTED.format("sleeper"))
    assert time.monotonic() - killed_at >= 1.0
    assert second != first and process_alive(second)

    mark = output.mark()
    killed_at = time.monotonic()
    os.kill(second, signal.SIGKILL)
    output.wait_for(r"sleeper exited .*; restarting in 2\.0 s, restart 2$", timeout_s=5, after=mark)
    third = pid_of(output, RESTARTED.format("sleeper"), after=mark)
    assert time.monotonic() - killed_at >= 2.0
    assert process_alive(third)


def test_stopping_while_a_restart_is_pending_restarts_nothing_and_stops_the_rest(drive):
    output = drive(("web", SLEEPS), ("worker", SLEEPS))
    web = pid_of(output, STARTED.format("web"))
    worker = pid_of(output, STARTED.format("worker"))

    os.kill(web, signal.SIGKILL)
    output.wait_for(r"web exited \(signal SIGKILL\); restarting in 1\.0 s", timeout_s=5)
    output.process.send_signal(signal.SIGTERM)

    assert output.process.wait(timeout=20) == 0
    output.wait_for(r"^\[driver\] stopped$", timeout_s=5)
    assert output.matching("restarted") == []
    assert not process_alive(worker)


def test_a_child_that_keeps_dying_is_retried_at_the_longest_delay_and_says_so(drive):
    output = drive(("flaky", EXITS_AT_ONCE), max_delay_s=2.0)

    output.wait_for(r"flaky exited \(exit code 3\); restarting in 1\.0 s, restart 1$", timeout_s=5)
    output.wait_for(
        r"flaky exited \(exit code 3\); restarting in 2\.0 s, restart 2; it keeps dying",
        timeout_s=10,
    )
    output.wait_for(r"restarting in 2\.0 s, restart 3; it keeps dying", timeout_s=10)


def test_backoff_doubles_from_one_second_up_to_thirty():
    backoff = Backoff()
    assert [backoff.take() for _ in range(7)] == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]


def test_a_server_is_restarted_at_once_then_with_growing_delays():
    backoff = Backoff(first_s=0.0)
    assert [backoff.take() for _ in range(4)] == [0.0, 1.0, 2.0, 4.0]


def test_backoff_starts_over_after_staying_up_a_while_but_not_after_failed_starts():
    backoff = Backoff()
    for _ in range(4):
        backoff.take()
    backoff.started()
    backoff.up_since -= STABLE_AFTER_S  # it has been up that long
    assert backoff.take() == 1.0
    assert backoff.take() == 2.0  # no start in between: the delay keeps growing


def test_a_signal_that_comes_while_the_wait_holds_its_lock_neither_blocks_nor_is_lost():
    supervisor = Supervisor()
    handled = threading.Event()

    def signal_inside_the_wait() -> None:
        # As a handler runs when the signal finds the main thread inside
        # `stopping.wait`, holding the Event's (not reentrant) lock.
        with supervisor.stopping._cond:
            supervisor.note_signal(signal.SIGTERM, None)
        handled.set()

    threading.Thread(target=signal_inside_the_wait, daemon=True).start()
    assert handled.wait(5), "the handler waited for a lock its own thread held"
    started = time.monotonic()
    supervisor.wait()
    assert supervisor.stopping.is_set() and time.monotonic() - started < 2


def test_a_storm_of_sigterms_stops_the_run_and_its_children(drive):
    output = drive(("sleeper", SLEEPS))
    child = pid_of(output, STARTED.format("sleeper"))
    for _ in range(200):
        output.process.send_signal(signal.SIGTERM)
    output.wait_for(r"\[driver\] stopped", timeout_s=15)
    assert output.process.wait(timeout=15) == 0
    assert not process_alive(child)
