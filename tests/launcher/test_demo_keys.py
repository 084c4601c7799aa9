"""`./run` on a data folder whose keys file belongs to another database (its own was
reset, say) stops before it loads the scenario or makes a password: the keys file is
kept as it was, and nothing shown once is lost."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.__main__ import said_if_a_step_fails
from tests.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]
OLDER_KEYS = '{"authorities": "of the database this folder had before"}'


def test_a_run_finding_a_keys_file_it_did_not_make_stops_before_any_password(tmp_path):
    (tmp_path / "keys.json").write_text(OLDER_KEYS)
    names = ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL", "CHANNEL_LAYER_URL")
    env = {k: v for k, v in os.environ.items() if k not in names}  # its own servers

    done = subprocess.run(
        [sys.executable, "-m", "launcher", "run", "--data-dir", str(tmp_path), "--fleet", "0",
         "--port", str(free_port())],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip

    assert done.returncode == 1
    assert f"CommandError: {tmp_path / 'keys.json'} already exists: it holds the keys" in (
        done.stderr
    )
    assert "password" not in done.stdout  # none was made, so none is lost
    failed = f"[launcher] a step failed ({ROOT / 'manage.py'} load_scenario, exit 1)"
    assert done.stdout.splitlines()[-3:] == ["[launcher] stopping", "[launcher] stopped", failed]
    assert (tmp_path / "keys.json").read_text() == OLDER_KEYS


def test_passwords_made_before_a_step_fails_are_said_before_the_run_stops(capsys):
    logins = ["Demo users, shown only now: ...", "Created administrator 'admin' with password: p"]
    with pytest.raises(subprocess.CalledProcessError), said_if_a_step_fails(logins):
        raise subprocess.CalledProcessError(1, ["manage.py", "generate_traffic"])
    assert capsys.readouterr().out.splitlines() == [f"[launcher] {line}" for line in logins]
