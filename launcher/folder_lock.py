"""A data folder's lock: who may start, adopt and stop the private servers in it.

`./run` and `python -m launcher services` hold their data folder alone: they start the
PostgreSQL and Redis in it, or adopt those an earlier run left, and stop them when
they end, and `./run` starts the demo's fleet (whose new tokens revoke those of a
fleet already running). A second one on the same folder is refused before it touches
anything, with the first's pid and start. Test runs share their folder (var/test) with
one another: each adopts what another started, and the last one out stops the servers.

The lock is the kernel's (flock on DATA_DIR/launcher.lock, which also says who holds
it): it ends with the process that took it, however that process ends, SIGKILL
included, so it is never stale. Its descriptor is not inherited (Python opens files
close-on-exec), so the servers and children a holder started never keep it.
"""

from __future__ import annotations

import fcntl
import os
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

LOCK_FILE_NAME = "launcher.lock"
SHARED_POLL_S = 0.2


class FolderInUse(Exception):
    """The data folder is held by another process; the message names it."""


@dataclass
class FolderLock:
    """A data folder's lock, held until `release` or the end of this process."""

    folder: Path
    descriptor: int

    def release(self) -> None:
        """Let the folder go (closing its only descriptor ends the flock)."""
        if self.descriptor >= 0:
            os.close(self.descriptor)
            self.descriptor = -1

    def take_alone(self) -> bool:
        """Whether this holder of a shared lock was its last holder; it then holds the
        folder alone. When another still shares it, this one no longer holds it (Linux
        lets go of a shared flock it fails to convert), and the other is the last."""
        try:
            fcntl.flock(self.descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True


def holder_description(command: str) -> str:
    """How a refused process names this one: './run (pid 1234, started 2026-12-07 10:02:03)'."""
    started = datetime.now().strftime("%Y-%m-%d %H:%M:%S")
    return f"{command} (pid {os.getpid()}, started {started})"


def hold_alone(folder: Path, holder: str) -> FolderLock:
    """Take `folder`'s lock for `holder` alone, or raise FolderInUse naming the
    process that holds it (at once: the caller has started nothing yet)."""
    lock = _opened(folder)
    try:
        fcntl.flock(lock.descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.release()
        raise FolderInUse(in_use(folder, "stop it first or use --data-dir")) from None
    _write_holder(lock, holder)
    return lock


def hold_shared(folder: Path, holder: str, *, wait_s: float) -> FolderLock:
    """Share `folder`'s lock with the other test runs. One that holds it alone is
    waited for up to `wait_s` (a run stopping its servers soon lets go), then refused
    with FolderInUse naming it (a `./run` on that folder holds it for as long as it runs)."""
    lock = _opened(folder)
    deadline = time.monotonic() + wait_s
    while not _locked_shared(lock):
        if time.monotonic() >= deadline:
            lock.release()
            raise FolderInUse(in_use(folder, "stop it first"))
        time.sleep(SHARED_POLL_S)
    _write_holder(lock, holder)
    return lock


def in_use(folder: Path, remedy: str) -> str:
    """The refusal: which folder, who holds it, and what to do."""
    return f"the data folder {shown(folder)} is in use by {_holder(folder)}; {remedy}"


def shown(folder: Path) -> str:
    """`folder` as its user would type it: relative to the current folder when inside it."""
    try:
        return str(folder.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(folder)


def _opened(folder: Path) -> FolderLock:
    folder.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(folder / LOCK_FILE_NAME, os.O_RDWR | os.O_CREAT, 0o600)
    return FolderLock(folder, descriptor)


def _locked_shared(lock: FolderLock) -> bool:
    try:
        fcntl.flock(lock.descriptor, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _write_holder(lock: FolderLock, holder: str) -> None:
    text = f"{holder}\n".encode()
    os.pwrite(lock.descriptor, text, 0)
    os.ftruncate(lock.descriptor, len(text))


def _holder(folder: Path) -> str:
    # Written just after the lock is taken: a holder caught in between has said nothing.
    try:
        said = (folder / LOCK_FILE_NAME).read_text().strip()
    except OSError:
        said = ""
    return said or "another process"
