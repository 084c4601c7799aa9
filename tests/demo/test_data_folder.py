"""The demo's files in its data folder are readable by the user alone, and a file of
keys, which exist nowhere else, is written once and never replaced."""

import json
import stat

import pytest

from demo.data_folder import (
    KeysFileExists,
    check_keys_file_is_new,
    demo_keys_file,
    write_demo_keys,
    write_demo_settings,
    write_new_private,
)

KEYS = {"authorities": {"trust-manager": {"key": "sna_x", "grants": {}}}}


def mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_keys_file_is_a_new_private_file_with_nothing_left_beside_it(tmp_path):
    path = demo_keys_file(tmp_path / "demo")

    write_demo_keys(path, KEYS)

    assert path == tmp_path / "demo" / "keys.json"
    assert mode(path) == 0o600
    assert json.loads(path.read_text())["authorities"]["trust-manager"]["key"] == "sna_x"
    assert [p.name for p in path.parent.iterdir()] == ["keys.json"]


def test_a_keys_file_already_there_is_refused_and_kept_as_it_was(tmp_path):
    path = demo_keys_file(tmp_path)
    path.write_text('{"authorities": "of the first load"}')

    with pytest.raises(KeysFileExists) as refused:
        write_demo_keys(path, KEYS)

    said = str(refused.value)
    assert said.startswith(f"{path} already exists: it holds the keys of a scenario")
    assert "--keys-file" in said and "Move it aside" in said
    assert path.read_text() == '{"authorities": "of the first load"}'
    assert [p.name for p in tmp_path.iterdir()] == ["keys.json"]


def test_a_keys_file_is_checked_before_anything_is_made(tmp_path):
    check_keys_file_is_new(tmp_path / "keys.json")
    (tmp_path / "keys.json").symlink_to(tmp_path / "elsewhere.json")  # dangling, still there
    with pytest.raises(KeysFileExists):
        check_keys_file_is_new(tmp_path / "keys.json")


def test_a_new_private_file_never_replaces_one_even_a_readable_one(tmp_path):
    path = tmp_path / "secret"
    path.write_text("kept")
    path.chmod(0o644)

    with pytest.raises(FileExistsError):
        write_new_private(path, "new")

    assert path.read_text() == "kept"
    assert [p.name for p in tmp_path.iterdir()] == ["secret"]


def test_the_settings_file_is_private(tmp_path):
    env = {"SECRET_KEY": "s", "DATABASE_URL": "postgresql://x", "REDIS_URL": "redis://y"}
    path = write_demo_settings(tmp_path, env)
    assert mode(path) == 0o600
    assert path.read_text().splitlines()[0] == "SECRET_KEY=s"
