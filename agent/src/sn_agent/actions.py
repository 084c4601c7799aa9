"""Running a configured action for one notification, so that it happens once.

The command is an argv list (never a shell line) and the notification reaches it only
as JSON on its standard input and SN_* variables: its content is never part of a
command line. It runs in a session (process group) of its own, as `user` if set, in
`cwd`, with only the variables its `env` lists.

Every run leaves files in `state_dir/running/` until its outcome is written down: the
notification (its standard input), its output, and a *mark* that a small gate writes.
The gate (`/bin/sh`, with a fixed script, the command passed as its arguments) waits
until the agent has written the delivery down as started, writes `started PID` to the
mark, runs the command, and writes `exit CODE`. So an agent that died at any moment
knows on its next start whether the command never ran (no `started`: run it now), is
still running (wait for it), finished (`exit`: answer with its real outcome), or was
killed with the agent (answer `failed`, or run it again if it is idempotent).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pwd
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Tuple

from sn_agent.client import Notification
from sn_agent.config import Action

OUTPUT_BYTES = 1024
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Fixed text. The gate's standard input is the gate, its output the mark, its errors
# the output file; $1 is the notification's file, then comes the command, as "$@":
# nothing of it is ever parsed. The file is given as /dev/fd/N, a descriptor the agent
# opened: an action run as another user cannot reach the agent's state folder (0700),
# and need not. (Not `<&N`: a POSIX shell need not redirect a descriptor above 9.)
GATE = (
    'input=$1; shift; read -r go || exit 125; printf "started %s\\n" "$$"; '
    '"$@" <"$input" >&2; code=$?; printf "exit %s\\n" "$code"; exit "$code"'
)
GATE_NAME = "sn-agent-action"
WAIT_POLL_S = 0.2


@dataclass(frozen=True)
class Outcome:
    """What became of an action: the answer sent back to the console."""

    status: str
    result: dict


@dataclass(frozen=True)
class Mark:
    """What the gate wrote: the command's process (group) id, and its exit code."""

    pid: Optional[int] = None
    exit_code: Optional[int] = None


class RunFiles:
    """The files of one run, named by its position."""

    def __init__(self, state_dir: Path, position: int) -> None:
        folder = Path(state_dir) / "running"
        self.input = folder / f"{position}.json"
        self.output = folder / f"{position}.out"
        self.mark = folder / f"{position}.mark"

    def write_input(self, payload: dict, *, owner: Optional[str] = None) -> None:
        """The notification, for the command's standard input; readable by `owner`
        alone when the action runs as another user (who opens it through the agent's
        descriptor, never through the folder)."""
        self.input.parent.mkdir(mode=0o700, exist_ok=True)
        if self.input.exists():  # a run again after a restart: the old one is read-only
            self.input.unlink()
        self.input.write_text(json.dumps(payload) + "\n", encoding="utf-8")
        self.input.chmod(0o400)
        if owner is not None:
            entry = pwd.getpwnam(owner)
            os.chown(self.input, entry.pw_uid, entry.pw_gid)

    def read_notification(self):
        """The notification this run was given, or None if its file is gone."""
        try:
            payload = json.loads(self.input.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return Notification.from_frame(payload)

    def read_mark(self) -> Mark:
        try:
            words = self.mark.read_text(encoding="ascii", errors="replace").split()
        except FileNotFoundError:
            return Mark()
        values = dict(zip(words[0::2], words[1::2]))
        return Mark(_int(values.get("started")), _int(values.get("exit")))

    def output_head(self) -> str:
        try:
            with open(self.output, "rb") as file:
                return file.read(OUTPUT_BYTES).decode("utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def remove(self) -> None:
        for path in (self.input, self.output, self.mark):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()


def _int(text: Optional[str]) -> Optional[int]:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


class Gated:
    """An action's process, started but held at the gate until `open()`."""

    def __init__(self, process: asyncio.subprocess.Process, gate_fd: int, files: RunFiles):
        self.process = process
        self.gate_fd = gate_fd
        self.files = files

    def open(self) -> None:
        """Let the command run (the delivery is written down as started)."""
        os.write(self.gate_fd, b"go\n")
        os.close(self.gate_fd)

    async def outcome(self, action: Action) -> Outcome:
        """Wait for the command within its time-out; kill its group after it."""
        try:
            await asyncio.wait_for(self.process.wait(), timeout=action.timeout_s)
        except asyncio.TimeoutError:
            kill_group(self.process.pid)
            await self.process.wait()
            return timed_out(action, self.files)
        return finished(self.process.returncode, self.files)


async def start(action: Action, notification, files: RunFiles) -> Gated:
    """Start `action`'s command for `notification`, held at the gate."""
    files.write_input(_payload(notification), owner=action.user)
    gate_read, gate_write = os.pipe()
    try:
        with open(files.mark, "wb") as mark, open(files.output, "wb") as output, \
                open(files.input, "rb") as given:  # fmt: skip
            process = await asyncio.create_subprocess_exec(
                "/bin/sh", "-c", GATE, GATE_NAME, f"/dev/fd/{given.fileno()}", *action.command,
                stdin=gate_read, stdout=mark, stderr=output, start_new_session=True,
                pass_fds=(given.fileno(),), cwd=str(action.cwd) if action.cwd else None,
                env=environment(action, notification), **as_user(action),
            )  # fmt: skip
    except BaseException:
        os.close(gate_write)
        raise
    finally:
        os.close(gate_read)
    return Gated(process, gate_write, files)


def environment(action: Action, notification) -> dict:
    """Only what the action's `env` lists (and a PATH), and the notification's SN_*."""
    env = {name: os.environ[name] for name in action.env if name in os.environ}
    env.setdefault("PATH", DEFAULT_PATH)
    env.update(
        SN_EVENT_ID=notification.event,
        SN_POSITION=str(notification.position),
        SN_SENDER=str(notification.sender),
        SN_DELIVERY=str(notification.delivery),
        SN_CHANNEL=notification.channel,
        SN_ACTION=action.name,
    )
    return env


def as_user(action: Action) -> dict:
    """Popen's arguments to run as `action.user` (the agent must be root to switch)."""
    if action.user is None:
        return {}
    entry = pwd.getpwnam(action.user)
    return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}


def finished(exit_code: int, files: RunFiles) -> Outcome:
    status = "ok" if exit_code == 0 else "failed"
    return Outcome(status, {"exit_code": exit_code, "output": files.output_head()})


def timed_out(action: Action, files: RunFiles) -> Outcome:
    reason = f"timed out after {action.timeout_s:g} s; its process group was killed"
    return Outcome("failed", {"exit_code": None, "output": files.output_head(), "error": reason})


def refused(reason: str) -> Outcome:
    return Outcome("failed", {"exit_code": None, "output": "", "error": reason})


def not_configured() -> Outcome:
    return refused("no such action here")


def kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def alive(pid: int, *, group: bool = False) -> bool:
    """Whether the process (or, with `group`, the process group) `pid` exists."""
    try:
        (os.killpg if group else os.kill)(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, as another user
        return True
    return True


async def outcome_after_restart(
    action: Optional[Action], files: RunFiles, *, started_at: float, same_boot: bool
) -> Tuple[Optional[Outcome], bool]:
    """For a delivery written down as started by an agent that died: (its outcome, or
    None if the command never ran and may run now; whether it was cut short).
    A command still running is waited for, within what is left of its time-out."""
    mark = files.read_mark()
    if mark.pid is None:
        return None, False
    if mark.exit_code is None and same_boot:
        timeout_s = action.timeout_s if action else 0.0
        await _wait_for_group(mark.pid, deadline=started_at + timeout_s)
        mark = files.read_mark()
    if mark.exit_code is not None:
        return finished(mark.exit_code, files), False
    return None, True


async def _wait_for_group(pgid: int, *, deadline: float) -> None:
    while alive(pgid, group=True):
        if time.time() >= deadline:
            kill_group(pgid)
            return
        await asyncio.sleep(WAIT_POLL_S)


def _payload(notification) -> dict:
    return {
        "delivery": notification.delivery,
        "position": notification.position,
        "event": notification.event,
        "sender": notification.sender,
        "channel": notification.channel,
        "sequence": notification.sequence,
        "content": notification.content,
    }
