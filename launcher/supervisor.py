"""Start child processes, prefix their output, restart those that die (with backoff),
keep the private servers running, and stop everything, in order, once."""

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
from typing import Protocol

STOP_TIMEOUT_S = 15.0
PR_SET_PDEATHSIG = 1
# Children are looked at this often; services (a ping or a pid check each) every second.
CHILD_CHECK_S = 0.2
SERVICE_CHECK_S = 1.0
# Restart delays: FIRST_DELAY_S, doubled on each death up to MAX_DELAY_S. Whatever stays
# up for STABLE_AFTER_S starts again from the beginning when it next dies.
FIRST_DELAY_S = 1.0
MAX_DELAY_S = 30.0
STABLE_AFTER_S = 60.0
# How long the output of a dead child may take to drain before its exit is logged.
DRAIN_TIMEOUT_S = 1.0


# The output pumps and the launcher write from several threads: each line goes out whole,
# under this lock (print() writes the text and its newline separately, so another
# thread's line could land between them).
_OUTPUT_LOCK = threading.Lock()


def write_line(line: str) -> None:
    """One whole line on standard output, never interleaved with another thread's."""
    with _OUTPUT_LOCK:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def say(message: str) -> None:
    """One line of the launcher's own log."""
    write_line(f"[launcher] {message}")


def _find_prctl():
    # Looked up here, once: the child calls it between fork and exec, where loading a
    # library could deadlock on a lock a thread of the launcher (an output pump) held.
    try:
        return ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux: children still stop on a normal exit
        return None


_PRCTL = _find_prctl()


def die_with_parent() -> None:
    """In the child: ask Linux to send SIGTERM when the launcher dies, even by SIGKILL."""
    if _PRCTL is not None:
        _PRCTL(PR_SET_PDEATHSIG, signal.SIGTERM)


def describe_exit(returncode: int) -> str:
    """'signal SIGKILL' or 'exit code 1', for the log."""
    if returncode < 0:
        with contextlib.suppress(ValueError):
            return f"signal {signal.Signals(-returncode).name}"
        return f"signal {-returncode}"
    return f"exit code {returncode}"


@dataclass
class Backoff:
    """Delays between restarts of one thing: `first_s` (0: at once), then doubling from
    FIRST_DELAY_S up to `max_s`; back to `first_s` once it has stayed up a while."""

    first_s: float = FIRST_DELAY_S
    max_s: float = MAX_DELAY_S
    restarts: int = 0
    next_s: float = field(init=False)
    up_since: float | None = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        self.next_s = self.first_s

    def take(self) -> float:
        """The delay before the next attempt to start it (counted as a restart)."""
        if self.up_since is not None and time.monotonic() - self.up_since >= STABLE_AFTER_S:
            self.next_s = self.first_s  # it ran long enough: this death is news, not a loop
        self.up_since = None  # failed attempts until `started` only lengthen the delay
        delay = self.next_s
        self.next_s = min(self.max_s, max(FIRST_DELAY_S, delay * 2))
        self.restarts += 1
        return delay

    def started(self) -> None:
        self.up_since = time.monotonic()

    def at_longest(self, delay: float) -> bool:
        """Whether `delay` is already the longest: the thing keeps dying."""
        return delay >= self.max_s


@dataclass
class Program:
    """What a child runs, kept so that it can be started again the same way."""

    name: str
    argv: list[str]
    env: dict[str, str]
    pass_fds: tuple[int, ...] = ()


@dataclass
class Child:
    """One supervised process: its program, its current process, and its restarts."""

    program: Program
    process: subprocess.Popen
    pump: threading.Thread
    backoff: Backoff
    restart_at: float | None = None  # set while it is dead and waiting for its restart

    @property
    def name(self) -> str:
        return self.program.name

    def alive(self) -> bool:
        return self.process.poll() is None


class Service(Protocol):
    """A server the launcher started itself and restarts in place when it dies."""

    name: str

    def running(self) -> bool: ...

    def restart(self) -> None: ...


@dataclass
class WatchedService:
    service: Service
    # A server is restarted at once when it is first found dead; again only with backoff.
    backoff: Backoff
    retry_at: float | None = None
    checked_at: float = 0.0


@dataclass
class Supervisor:
    """Owns the children of a launcher run and the servers it started: restarts what
    dies, and on request stops the children in reverse start order."""

    children: list[Child] = field(default_factory=list)
    services: list[WatchedService] = field(default_factory=list)
    stopping: threading.Event = field(default_factory=threading.Event)
    max_delay_s: float = MAX_DELAY_S
    # Set by the signal handlers, which must take no lock (`note_signal`).
    signalled: bool = False

    def start(
        self, name: str, argv: list[str], env: dict[str, str], *, pass_fds: tuple[int, ...] = ()
    ) -> Child:
        """Start `argv` and keep it running until `stop_all`."""
        program = Program(name, argv, env, pass_fds)
        process, pump = self._spawn(program)
        child = Child(program, process, pump, Backoff(max_s=self.max_delay_s))
        self.children.append(child)
        say(f"{name} started (pid {process.pid})")
        return child

    def watch(self, service: Service) -> None:
        """Check `service` about every second while waiting; restart it when it is down."""
        self.services.append(WatchedService(service, Backoff(0.0, self.max_delay_s)))

    def _spawn(self, program: Program) -> tuple[subprocess.Popen, threading.Thread]:
        # Its own session, so that Ctrl-C reaches only the launcher, and so that the
        # child's own children (a worker's pool) can be signalled with it as a group.
        process = subprocess.Popen(
            program.argv,
            env=program.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=die_with_parent,
            pass_fds=program.pass_fds,
        )
        pump = threading.Thread(target=_pump, args=(program.name, process), daemon=True)
        pump.start()
        return process, pump

    def install_signal_handlers(self) -> None:
        """Ctrl-C and SIGTERM ask the run to stop (`wait` returns)."""
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, self.note_signal)

    def note_signal(self, *_) -> None:
        """The signal handler. It only notes the signal: a handler runs between two
        steps of the main thread, which may be inside `stopping.wait` holding the
        Event's lock right then, and setting the Event there would wait for that lock
        for ever (a SIGTERM that came at that moment left `./run` hanging)."""
        self.signalled = True

    def wait(self) -> None:
        """Supervise until asked to stop (Ctrl-C, SIGTERM): restart children and
        services that die. Nothing is started once stopping is set."""
        while True:
            self.stopping.wait(CHILD_CHECK_S)  # a signal does not wake it: it only notes
            if self._asked_to_stop():
                return
            for watched in self.services:
                self._tend_service(watched)
            for child in self.children:
                if self._asked_to_stop():
                    return
                self._tend_child(child)

    def _asked_to_stop(self) -> bool:
        if self.signalled:
            self.stopping.set()
        return self.stopping.is_set()

    def _tend_child(self, child: Child) -> None:
        if child.restart_at is None and not child.alive():
            self._schedule_restart(child)
        elif child.restart_at is not None and time.monotonic() >= child.restart_at:
            child.process, child.pump = self._spawn(child.program)
            child.backoff.started()
            child.restart_at = None
            say(f"{child.name} restarted (pid {child.process.pid})")

    def _schedule_restart(self, child: Child) -> None:
        # The dead child's own children (a worker's pool) would hold its queue's tasks
        # and its output pipe: they go with it.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.process.pid, signal.SIGKILL)
        child.pump.join(DRAIN_TIMEOUT_S)
        delay = child.backoff.take()
        child.restart_at = time.monotonic() + delay
        note = (
            "; it keeps dying, retried at the longest interval"
            if child.backoff.at_longest(delay)
            else ""
        )
        say(
            f"{child.name} exited ({describe_exit(child.process.returncode)}); "
            f"restarting in {delay:.1f} s, restart {child.backoff.restarts}{note}"
        )

    def _tend_service(self, watched: WatchedService) -> None:
        now = time.monotonic()
        if watched.retry_at is None and now - watched.checked_at < SERVICE_CHECK_S:
            return
        watched.checked_at = now
        name = watched.service.name
        if watched.retry_at is None:
            if watched.service.running():
                return
            delay = watched.backoff.take()
            watched.retry_at = now + delay
            say(f"{name} is down; restarting it in place in {delay:.1f} s")
        if now >= watched.retry_at:
            self._restart_service(watched)

    def _restart_service(self, watched: WatchedService) -> None:
        name = watched.service.name
        try:
            watched.service.restart()
        except Exception as error:  # any failure to start is retried, and said
            delay = watched.backoff.take()
            watched.retry_at = time.monotonic() + delay
            reason = f"{type(error).__name__}: {error}"
            say(f"{name} did not start ({reason}); retrying in {delay:.1f} s")
            return
        watched.retry_at = None
        watched.backoff.started()
        say(f"{name} restarted, restart {watched.backoff.restarts}")

    def stop_all(self) -> None:
        """SIGTERM every running child (newest first), then SIGKILL what lingers of its
        process group. A child waiting for its restart is not started again."""
        running = [child for child in reversed(self.children) if child.alive()]
        for child in reversed(self.children):
            # Only the child itself is asked: a Celery worker then stops its pool after
            # the running tasks (its pool, signalled directly, would die mid-task). A
            # dead child's group may still hold its orphans: they get no grace.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if child in running:
                    os.kill(child.process.pid, signal.SIGTERM)
                else:
                    os.killpg(child.process.pid, signal.SIGKILL)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for child in running:
            remaining = max(0.1, deadline - time.monotonic())
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.process.wait(timeout=remaining)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(child.process.pid, signal.SIGKILL)
            child.process.wait()


def _pump(name: str, process: subprocess.Popen) -> None:
    """Copy a child's output to ours, each line prefixed with the child's name."""
    for raw in iter(process.stdout.readline, b""):
        line = raw.decode(errors="replace").rstrip()
        write_line(f"[{name}] {line}")
    process.stdout.close()


# The web server sends no WebSocket pings (0: none). Uvicorn pinged every socket on a
# timer of its own, busy or not: a ping and a pong per agent a minute beside the
# heartbeats that already say the connection lives. A web process closes the agent
# sessions it hears nothing from itself (broker.protocol.SilenceWatch).
WEB_PING_EVERY_S = 0
# A frame larger than this closes its socket (1009) before the console reads it; one up
# to it is read and refused with `too_large` when over broker.protocol.MAX_FRAME_BYTES.
WEB_MAX_MESSAGE_BYTES = 1024 * 1024


def web_server_argv(listener: socket.socket, *, verbose: bool = False) -> list[str]:
    """Uvicorn serving the console from `listener`, which several processes share.

    Uvicorn, not Daphne: on uvloop, httptools and the websockets library, a web
    process spends a quarter less CPU on the same fleet (docs/benchmarks.md). Proxy
    headers are ignored (the peer is who connected: login lockouts count by it), and
    WebSocket compression is off (agents' frames are small; it cost CPU per frame)."""
    # `python -m uvicorn`, not the venv's script: its #! line may name another path.
    argv = [sys.executable, "-m", "uvicorn", "--fd", str(listener.fileno())]
    # The websockets library's sans-I/O protocol, forgetting each socket's handshake
    # once it is open (launcher.web_sockets).
    argv += ["--loop", "uvloop", "--http", "httptools"]
    argv += ["--ws", "launcher.web_sockets:HandshakeForgettingProtocol"]
    argv += ["--ws-ping-interval", str(WEB_PING_EVERY_S)]
    argv += ["--ws-max-size", str(WEB_MAX_MESSAGE_BYTES), "--ws-per-message-deflate", "false"]
    argv += ["--lifespan", "off", "--no-proxy-headers", "--no-server-header"]
    argv += ["--timeout-graceful-shutdown", "5"]
    # Quiet unless asked: an access line per request would scroll everything else away.
    argv += ["--log-level", "info"] if verbose else ["--log-level", "warning", "--no-access-log"]
    return [*argv, "console.asgi:application"]


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
