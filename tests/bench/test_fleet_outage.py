"""The fleet benchmark's outage: an agent counts as back only by its fleet process's
reports made after the kill (LoggedIn), and the phase's CPU time is that of the web
processes started in it, none of the killed ones' (Phases)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time

from bench.fleet import LoggedIn, Phases
from bench.services import cpu_seconds


class FleetOutput:
    """A fleet process whose report lines are given (its stdout)."""

    def __init__(self, *reports: dict) -> None:
        self.stdout = io.StringIO("".join(json.dumps(r) + "\n" for r in reports))


def read(*reports: dict) -> LoggedIn:
    logged_in = LoggedIn(FleetOutput(*reports))
    logged_in.thread.join(timeout=5)
    return logged_in


def test_a_fleet_process_silent_since_the_kill_counts_none_back():
    logged_in = read({"fleet": 0, "logged_in": 500, "at": 90.0},
                     {"fleet": 1, "logged_in": 200, "at": 101.0})  # fmt: skip
    assert logged_in.now_since(100.0) == 200
    assert logged_in.all_back_since(100.0, 700) is None


def test_all_are_back_when_every_process_says_so_after_the_kill():
    logged_in = read({"fleet": 0, "logged_in": 500, "at": 104.0},
                     {"fleet": 1, "logged_in": 500, "at": 107.5},
                     {"fleet": 0, "logged_in": 499, "at": 90.0})  # fmt: skip
    # Each process's last report counts: fleet 0's (499) was made before the kill.
    assert logged_in.now_since(100.0) == 500
    logged_in.latest[0] = {"fleet": 0, "logged_in": 500, "at": 108.0}
    assert logged_in.all_back_since(100.0, 1000) == 108.0


def test_a_phase_counts_the_cpu_of_processes_started_in_it_and_none_of_those_killed():
    # The outage phase: the web processes are killed and others started in their place.
    killed = subprocess.Popen([sys.executable, "-c", BUSY.format(seconds=0.3) + IDLE])
    while cpu_seconds([killed.pid]) < 0.3:  # its time before the phase: none of it counts
        time.sleep(0.05)
    web_pids, started = [killed.pid], []
    phases = Phases({"web": web_pids})

    def outage() -> None:
        killed.kill()
        killed.wait()
        process = subprocess.Popen([sys.executable, "-c", BUSY.format(seconds=0.3)])
        web_pids.append(process.pid)
        started.append(process)
        # Ended but not reaped: /proc still has its time, as a living process's.
        os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOWAIT)

    phases.measure("outage", outage)
    its_own = cpu_seconds([started[0].pid])
    started[0].wait()
    [(_, _, spent, _)] = phases.rows
    assert spent["web"] == its_own and 0.25 <= its_own < 0.5


BUSY = """
import time
end = time.process_time() + {seconds}
while time.process_time() < end:
    pass
"""
IDLE = "time.sleep(60)"
