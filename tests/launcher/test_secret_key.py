"""`./run`'s secret key (DATA_DIR/secret_key) is made once, private from its first byte,
and never replaced: sessions and second-factor proofs are signed with it."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

from launcher.__main__ import persistent_secret_key

ROOT = Path(__file__).resolve().parents[2]


def test_the_secret_key_is_made_once_privately_and_kept(tmp_path):
    made = persistent_secret_key(tmp_path / "demo")

    path = tmp_path / "demo" / "secret_key"
    assert len(made) >= 50
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert persistent_secret_key(tmp_path / "demo") == made
    assert [p.name for p in path.parent.iterdir()] == ["secret_key"]


def test_a_secret_key_put_there_is_used_as_it_is(tmp_path):
    (tmp_path / "secret_key").write_text("the key of the sessions\n")
    assert persistent_secret_key(tmp_path) == "the key of the sessions"
    assert (tmp_path / "secret_key").read_text() == "the key of the sessions\n"


def test_processes_making_the_key_at_once_all_get_the_one_kept(tmp_path):
    code = "import sys; from launcher.__main__ import persistent_secret_key as key; "
    code += "from pathlib import Path; print(key(Path(sys.argv[1])))"
    argv = [sys.executable, "-c", code, str(tmp_path)]
    makers = [subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, text=True) for _ in range(6)]
    said = {maker.communicate(timeout=60)[0].strip() for maker in makers}
    assert said == {(tmp_path / "secret_key").read_text()}


def test_an_empty_secret_key_stops_the_run_naming_the_file(tmp_path):
    (tmp_path / "secret_key").write_text("")
    env = {k: v for k, v in os.environ.items() if k != "SECRET_KEY"}
    done = subprocess.run(
        [sys.executable, "-m", "launcher", "run", "--data-dir", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stdout.startswith(
        f"[launcher] configuration error: {tmp_path / 'secret_key'} is empty: put the secret "
    )
    assert not (tmp_path / "postgres").exists()  # nothing was started
    assert (tmp_path / "secret_key").read_text() == ""
