"""The running demo's settings, left in its data folder by `./run` and read by
`manage.py`, so that management commands work beside the demo with nothing to copy by
hand. Standard library only: manage.py reads it before Django is set up."""

from __future__ import annotations

import os
from pathlib import Path

FILE_NAME = "environment"
SHARED_VARIABLES = ("SECRET_KEY", "DATABASE_URL", "REDIS_URL")
ROOT = Path(__file__).resolve().parent.parent


def default_data_dir() -> Path:
    """The demo's data folder: DATA_DIR, or var/demo in the checkout."""
    return Path(os.environ.get("DATA_DIR") or ROOT / "var" / "demo").resolve()


def write_demo_settings(data_dir: Path, env: dict[str, str]) -> Path:
    """Write the settings the processes of this run use; return the file."""
    path = data_dir / FILE_NAME
    path.write_text("".join(f"{name}={env[name]}\n" for name in SHARED_VARIABLES))
    path.chmod(0o600)  # it holds the secret key
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
