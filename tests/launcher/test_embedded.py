"""The private servers the launcher starts are real, keep their data, and stop."""

import psycopg
import redis

from launcher.embedded import EmbeddedPostgres, EmbeddedRedis


def test_private_redis_starts_keeps_data_across_restarts_and_stops(tmp_path):
    server = EmbeddedRedis(tmp_path / "redis")
    server.start()
    try:
        redis.Redis.from_url(server.url()).set("fleet", "alive")
    finally:
        server.stop()
    assert not server.socket_path.exists() or not server._answers_ping()

    server.start()
    try:
        assert redis.Redis.from_url(server.url()).get("fleet") == b"alive"
    finally:
        server.stop()


def test_private_redis_adopts_a_server_left_running_and_can_stop_it(tmp_path):
    first = EmbeddedRedis(tmp_path / "redis")
    first.start()
    try:
        second = EmbeddedRedis(tmp_path / "redis")
        second.start()
        assert second.process is None
        second.stop()
        assert not first._answers_ping()
        first.process.wait(timeout=10)
    finally:
        first.stop()


def test_private_postgres_creates_the_database_and_reuses_its_data(tmp_path):
    server = EmbeddedPostgres(tmp_path / "pg")
    server.start()
    try:
        server.ensure_database("console")
        server.ensure_database("console")  # a second call finds it
        with psycopg.connect(server.url("console"), autocommit=True) as connection:
            connection.execute("CREATE TABLE kept (value text)")
            connection.execute("INSERT INTO kept VALUES ('yes')")
    finally:
        server.stop()

    server.start()
    try:
        with psycopg.connect(server.url("console")) as connection:
            assert connection.execute("SELECT value FROM kept").fetchone() == ("yes",)
    finally:
        server.stop()
