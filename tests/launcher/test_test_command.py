"""`python -m launcher test` (what ./test runs) chooses the tier and its environment."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_pure_policy_tests_run_with_no_settings_and_no_server():
    env = {
        name: value
        for name, value in os.environ.items()
        if name not in {"SECRET_KEY", "DATABASE_URL", "REDIS_URL"}
    }
    # As a shell with the console's settings exported would have it.
    env["DJANGO_SETTINGS_MODULE"] = "console.settings"
    argv = [sys.executable, "-m", "launcher", "test", "tests/policies/test_bitsets.py", "-n", "0"]

    run = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)

    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert " passed" in run.stdout
    assert "starting private" not in run.stdout + run.stderr
