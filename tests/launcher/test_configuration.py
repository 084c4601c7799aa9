"""`./run` refuses a malformed variable of its own before it starts anything, naming it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("WORKER_CONCURRENCY", "two", "WORKER_CONCURRENCY must be a whole number, got 'two'."),
        ("WORKER_CONCURRENCY", "0", "WORKER_CONCURRENCY must be at least 1, got 0."),
        ("WEB_PROCESSES", "-1", "WEB_PROCESSES must be at least 1, got -1."),
        ("DEMO_FLEET", "many", "DEMO_FLEET must be a whole number, got 'many'."),
    ],
)
def test_run_stops_before_starting_anything_when_a_variable_is_malformed(
    tmp_path, variable, value, message
):
    data_dir = tmp_path / "demo"
    result = subprocess.run(
        [sys.executable, "-m", "launcher", "run", "--data-dir", str(data_dir)],
        cwd=ROOT,
        env={**os.environ, variable: value},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (result.returncode, result.stdout) == (2, f"[launcher] configuration error: {message}\n")
    assert not data_dir.exists()  # no private server, secret key or schedule was made
