"""The running demo's settings, left in its data folder by `./run` and read by
`manage.py`, so that management commands work beside the demo with nothing to copy by
hand; and the demo's keys, kept there when its scenario is loaded so that the
attestation API can be tried at once. Standard library only: manage.py reads it before
Django is set up.

A file of secrets that cannot be made again (the keys, shown once and stored only as
digests; the secret key that signs the sessions) is written once, as a new file, and
never replaced: `write_new_private` refuses a file that is there."""

from __future__ import annotations

import json
import os
from pathlib import Path

FILE_NAME = "environment"
KEYS_FILE_NAME = "keys.json"
SHARED_VARIABLES = ("SECRET_KEY", "DATABASE_URL", "REDIS_URL", "SIGNING_KEYS_DIR")
SIGNING_KEYS_FOLDER = "signing-keys"
ROOT = Path(__file__).resolve().parent.parent


def default_data_dir() -> Path:
    """The demo's data folder: DATA_DIR, or var/demo in the checkout."""
    return Path(os.environ.get("DATA_DIR") or ROOT / "var" / "demo").resolve()


def write_demo_settings(data_dir: Path, env: dict[str, str]) -> Path:
    """Write the settings the processes of this run use; return the file. Written
    again by each run, by the one run that holds the folder (launcher.folder_lock):
    all it holds is said elsewhere (the secret key is DATA_DIR/secret_key's, or the
    environment's), so a stale copy is not worth keeping."""
    text = "".join(f"{name}={env[name]}\n" for name in SHARED_VARIABLES if name in env)
    return write_private(data_dir / FILE_NAME, text)  # it holds the secret key


def signing_keys_dir(data_dir: Path) -> Path:
    """Where the demo's console keeps its signing keys (SIGNING_KEYS_DIR), made private."""
    folder = data_dir / SIGNING_KEYS_FOLDER
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    return folder


def demo_keys_file(data_dir: Path | None = None) -> Path:
    """Where the demo's authority and grant keys are kept."""
    return (data_dir or default_data_dir()) / KEYS_FILE_NAME


class KeysFileExists(FileExistsError):
    """A keys file is already there: it holds the keys of a scenario loaded before,
    perhaps into another database, which exist nowhere else."""

    def __init__(self, path: Path) -> None:
        super().__init__(
            f"{path} already exists: it holds the keys of a scenario loaded before (into "
            "this database or another), shown once and kept nowhere else, so it is not "
            "replaced. Move it aside (delete it only if the database it belongs to is "
            "gone), or give load_scenario another file (--keys-file)"
        )
        self.path = path


def check_keys_file_is_new(path: Path) -> None:
    """Refuse (KeysFileExists) to keep new keys in `path` if a file is there; said
    before anything is loaded, so that nothing is loaded whose keys could not be kept."""
    if path.exists() or path.is_symlink():
        raise KeysFileExists(path)


def write_demo_keys(path: Path, keys: dict) -> Path:
    """Keep the demo's keys (shown once by the services, stored only as digests) in
    `path`, a new file readable by the user alone; KeysFileExists if one is there."""
    try:
        return write_new_private(path, json.dumps(keys, indent=2) + "\n")
    except FileExistsError:
        raise KeysFileExists(path) from None


def write_new_private(path: Path, text: str) -> Path:
    """Write `text` to `path`, a new file readable and writable by the user alone from
    its first byte; FileExistsError if `path` is there, which is left as it was. The
    text is written under a passing name and linked into place, so that `path` is
    there whole or not at all, and a link never replaces a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        _write_synced(partial, text)
        os.link(partial, path)
    finally:
        partial.unlink(missing_ok=True)
    return path


def _write_synced(path: Path, text: str) -> None:
    # The passing file is this process's own (its pid in the name): one left by a
    # process that died is only the start of a text that never reached its place.
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(descriptor, 0o600)
    with os.fdopen(descriptor, "w") as file:
        file.write(text)
        file.flush()
        os.fsync(file.fileno())


def write_private(path: Path, text: str) -> Path:
    """Write `text` to `path`, readable and writable by the user alone from the first
    byte (a file that was there keeps its old mode through a rewrite: it is set again)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(descriptor, 0o600)
    with os.fdopen(descriptor, "w") as file:
        file.write(text)
    return path


def use_demo_settings(data_dir: Path | None = None) -> None:
    """Take the demo's settings for whatever the environment does not set."""
    path = (data_dir or default_data_dir()) / FILE_NAME
    if not path.is_file():
        return
    for line in path.read_text().splitlines():
        name, sep, value = line.partition("=")
        if sep and name:
            os.environ.setdefault(name, value)
