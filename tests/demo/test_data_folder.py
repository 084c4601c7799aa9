"""The demo's files in its data folder are readable by the user alone."""

import json
import stat

from demo.data_folder import demo_keys_file, write_demo_keys, write_demo_settings


def mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_keys_file_is_private_even_when_an_older_one_was_readable(tmp_path):
    path = demo_keys_file(tmp_path / "demo")
    path.parent.mkdir()
    path.write_text("{}")
    path.chmod(0o644)

    write_demo_keys(path, {"authorities": {"trust-manager": {"key": "sna_x", "grants": {}}}})

    assert path == tmp_path / "demo" / "keys.json"
    assert mode(path) == 0o600
    assert json.loads(path.read_text())["authorities"]["trust-manager"]["key"] == "sna_x"


def test_the_settings_file_is_private(tmp_path):
    env = {"SECRET_KEY": "s", "DATABASE_URL": "postgresql://x", "REDIS_URL": "redis://y"}
    path = write_demo_settings(tmp_path, env)
    assert mode(path) == 0o600
    assert path.read_text().splitlines()[0] == "SECRET_KEY=s"
