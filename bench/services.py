"""Private PostgreSQL and Redis for the benchmarks, and a fresh database per run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def provide_services(env: dict[str, str]) -> list:
    """Private PostgreSQL and Redis for the benchmark unless URLs are given."""
    from launcher.embedded import EmbeddedPostgres, EmbeddedRedis

    started = []
    if not env.get("DATABASE_URL"):
        postgres = EmbeddedPostgres(ROOT / "var" / "bench" / "postgres")
        postgres.start()
        started.append(postgres)
        env["DATABASE_URL"] = postgres.url("bench")
    if not env.get("REDIS_URL"):
        redis_server = EmbeddedRedis(ROOT / "var" / "bench" / "redis")
        redis_server.start()
        started.append(redis_server)
        env["REDIS_URL"] = redis_server.url()
        import redis

        # Our own private server: leftovers of an earlier run must not be measured.
        redis.Redis.from_url(env["REDIS_URL"]).flushdb()
    return started


def fresh_database(env: dict[str, str]) -> None:
    """Drop and create the benchmark's database, then migrate it."""
    from urllib.parse import urlsplit, urlunsplit

    import psycopg

    parts = urlsplit(env["DATABASE_URL"])
    name = parts.path.lstrip("/")
    admin_url = urlunsplit(parts._replace(path="/postgres"))
    with psycopg.connect(admin_url, autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        connection.execute(f'CREATE DATABASE "{name}"')
    manage = [sys.executable, str(ROOT / "manage.py")]
    subprocess.run([*manage, "migrate", "-v", "0"], env=env, check=True)
