"""The fleet benchmark counts an agent as back after an outage only by its fleet
process's reports made after the kill (bench/fleet.py, LoggedIn)."""

from __future__ import annotations

import io
import json

from bench.fleet import LoggedIn


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
