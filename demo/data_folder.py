"""The running demo's settings, left in its data folder by `./run` and read by
`manage.py`, so that management commands work beside the demo with nothing to copy by
hand; and the demo's keys, kept there when its scenario is loaded so that the
attestation API can be tried at once. Standard library only: manage.py reads it before
Django is set up."""

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
    """Write the settings the processes of this run use; return the file."""
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


def write_demo_keys(path: Path, keys: dict) -> Path:
    """Keep the demo's keys (shown once by the services, stored only as digests) in
    `path`, readable by the user alone."""
    return write_private(path, json.dumps(keys, indent=2) + "\n")


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
