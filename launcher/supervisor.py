"""Start child processes, prefix their output, and stop them all, in order, once."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

STOP_TIMEOUT_S = 15.0
PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """In the child: ask Linux to send SIGTERM when the launcher dies, even by SIGKILL."""
    # Not on Linux, there is no prctl: children are still stopped on a normal exit.
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass
class Child:
    """One supervised process with a short name for its output prefix."""

    name: str
    process: subprocess.Popen

    def alive(self) -> bool:
        return self.process.poll() is None


@dataclass
class Supervisor:
    """Owns the children of a launcher run; stops them in reverse start order."""

    children: list[Child] = field(default_factory=list)
    stopping: threading.Event = field(default_factory=threading.Event)

    def start(
        self, name: str, argv: list[str], env: dict[str, str], *, pass_fds: tuple[int, ...] = ()
    ) -> Child:
        """Start `argv` in its own session so Ctrl-C reaches only the launcher."""
        process = subprocess.Popen(
            argv,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=die_with_parent,
            pass_fds=pass_fds,
        )
        child = Child(name, process)
        self.children.append(child)
        threading.Thread(target=self._pump, args=(child,), daemon=True).start()
        return child

    def _pump(self, child: Child) -> None:
        for raw in iter(child.process.stdout.readline, b""):
            line = raw.decode(errors="replace").rstrip()
            sys.stdout.write(f"[{child.name}] {line}\n")
            sys.stdout.flush()

    def install_signal_handlers(self) -> None:
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda *_: self.stopping.set())

    def wait(self) -> str | None:
        """Block until asked to stop or a child exits; return the name of a dead child."""
        while not self.stopping.wait(0.5):
            for child in self.children:
                if not child.alive():
                    return child.name
        return None

    def stop_all(self) -> None:
        """SIGTERM every child (newest first), then SIGKILL those that linger."""
        for child in reversed(self.children):
            if child.alive():
                os.killpg(child.process.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for child in reversed(self.children):
            remaining = max(0.1, deadline - time.monotonic())
            try:
                child.process.wait(timeout=remaining)
            except subprocess.TimeoutExpired:
                os.killpg(child.process.pid, signal.SIGKILL)
                child.process.wait()


def listening_socket(host: str, port: int) -> socket.socket:
    """The web server's listening socket, made here so that several processes share it;
    a port in use fails now, with a clear message."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((host.strip("[]"), port))
    except OSError as error:
        raise SystemExit(f"cannot listen on {host}:{port}: {error}") from None
    listener.listen(4096)
    listener.set_inheritable(True)
    return listener
