"""Configuration comes from the environment and bad values stop start-up loudly."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from console.env import (
    ConfigurationError,
    celery_broker_url_for,
    check_redis_url,
    env_bool,
    env_int,
    env_list,
    parse_database_url,
)

ROOT = Path(__file__).resolve().parents[2]


def test_boolean_words_are_understood(monkeypatch):
    monkeypatch.setenv("DEBUG", "Yes")
    assert env_bool("DEBUG", default=False) is True
    monkeypatch.setenv("DEBUG", "off")
    assert env_bool("DEBUG", default=True) is False


def test_a_word_that_is_not_boolean_names_the_variable(monkeypatch):
    monkeypatch.setenv("DEBUG", "maybe")
    with pytest.raises(ConfigurationError, match=r"DEBUG must be true or false.*'maybe'"):
        env_bool("DEBUG", default=False)


def test_integers_below_their_minimum_are_refused(monkeypatch):
    monkeypatch.setenv("HEALTH_CHECK_TIMEOUT_S", "0")
    with pytest.raises(ConfigurationError, match="HEALTH_CHECK_TIMEOUT_S must be at least 1"):
        env_int("HEALTH_CHECK_TIMEOUT_S", 3, minimum=1)


def test_a_list_with_an_empty_item_is_refused(monkeypatch):
    monkeypatch.setenv("ALLOWED_HOSTS", "a.example,,b.example")
    with pytest.raises(ConfigurationError, match="ALLOWED_HOSTS has an empty item"):
        env_list("ALLOWED_HOSTS", [])


def test_database_url_with_host_and_port_is_parsed():
    config = parse_database_url("DATABASE_URL", "postgresql://ops:s%40cret@db.internal:6543/sn")
    assert (config.user, config.password, config.host, config.port, config.name) == (
        "ops",
        "s@cret",
        "db.internal",
        "6543",
        "sn",
    )


def test_database_url_may_name_a_socket_directory():
    config = parse_database_url("DATABASE_URL", "postgresql://postgres@/console?host=/run/pg")
    assert (config.host, config.name) == ("/run/pg", "console")


def test_a_database_urls_tls_parameters_reach_psycopg():
    url = "postgresql://sn@db.internal/sn?sslmode=verify-full&sslrootcert=/etc/ssl/pg-ca.pem"
    entry = parse_database_url("DATABASE_URL", url).as_django()
    assert entry["OPTIONS"] == {"sslmode": "verify-full", "sslrootcert": "/etc/ssl/pg-ca.pem"}
    assert entry["HOST"] == "db.internal"


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("postgresql://db/sn?ssl_mode=require", "query parameter libpq does not know.*ssl_mode"),
        ("mysql://root@localhost/sn", "must be a PostgreSQL URL"),
        ("postgresql://localhost", "names no database"),
        ("postgresql://localhost:port/sn", "port that is not a number"),
    ],
)
def test_malformed_database_urls_are_refused_by_name(url, message):
    with pytest.raises(ConfigurationError, match=f"DATABASE_URL.*{message}|{message}"):
        parse_database_url("DATABASE_URL", url)


def test_redis_urls_must_be_redis_or_unix_sockets():
    assert check_redis_url("REDIS_URL", "redis://127.0.0.1:6379/0")
    with pytest.raises(ConfigurationError, match="REDIS_URL must be a Redis URL"):
        check_redis_url("REDIS_URL", "amqp://guest@localhost//")


def test_celery_gets_the_socket_spelling_of_a_unix_redis_url():
    # Kombu takes a socket's database as virtual_host, and would put `db` back to 0.
    assert (
        celery_broker_url_for("unix:///v/redis.sock?db=3")
        == "redis+socket:///v/redis.sock?virtual_host=3"
    )
    assert celery_broker_url_for("redis://h:6379/1") == "redis://h:6379/1"


def run_manage_check(**overrides: str) -> subprocess.CompletedProcess:
    env = {**os.environ, **overrides}
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "check"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("DEBUG", "maybe"),
        ("DATABASE_URL", "sqlite:///db.sqlite3"),
        ("REDIS_URL", "http://localhost"),
        ("LOG_LEVEL", "chatty"),
        ("SPARK_MASTER", ""),
        ("PRESENCE_REFRESH_S", "0"),
        ("SESSION_IDLE_MIN", "0"),
        ("SESSION_MAX_HOURS", "twelve"),
    ],
)
def test_start_up_stops_with_a_message_naming_the_malformed_variable(variable, value):
    result = run_manage_check(**{variable: value})
    if variable == "SPARK_MASTER":
        # An empty value means "use the default", which is valid.
        assert result.returncode == 0, result.stderr
        return
    assert result.returncode == 2
    assert result.stderr.startswith(f"Configuration error: {variable}")


def test_a_presence_refresh_too_short_for_the_heartbeat_is_refused():
    result = run_manage_check(AGENT_HEARTBEAT_S="10", PRESENCE_REFRESH_S="5")
    assert result.returncode == 2
    assert result.stderr.startswith("Configuration error: PRESENCE_REFRESH_S must be more")


def test_an_idle_limit_longer_than_the_sessions_lifetime_is_refused():
    result = run_manage_check(SESSION_IDLE_MIN="90", SESSION_MAX_HOURS="1")
    assert result.returncode == 2
    assert result.stderr.startswith("Configuration error: SESSION_IDLE_MIN must be at most")


def test_start_up_without_a_secret_key_says_so():
    env = {key: value for key, value in os.environ.items() if key != "SECRET_KEY"}
    result = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "check"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "SECRET_KEY is not set" in result.stderr


READ_BY_NAME = re.compile(
    r'(?:env_(?:str|int|bool|list|choice)|environ\.get|env\.get)\(\s*"([A-Z][A-Z0-9_]*)"'
)


def _variables_read() -> set[str]:
    """Names the settings, console.env, the launcher and the demo's data folder read from
    the environment."""
    sources = [ROOT / "console" / "settings.py", ROOT / "console" / "env.py"]
    sources += [*sorted((ROOT / "launcher").glob("*.py")), ROOT / "demo" / "data_folder.py"]
    return {name for path in sources for name in READ_BY_NAME.findall(path.read_text())}


def _variables_documented() -> set[str]:
    """Names in the first column of the tables of docs/configuration.md's sections
    "Read by the settings" and "Read by the launcher"."""
    sections = (ROOT / "docs" / "configuration.md").read_text().split("\n## Read by ")[1:]
    rows = [
        line
        for section in sections
        for line in section.split("\n## ")[0].splitlines()
        if line.startswith("| `")
    ]
    return {name for row in rows for name in re.findall(r"`([A-Z][A-Z0-9_]*)`", row.split("|")[1])}


def test_the_configuration_doc_lists_exactly_the_variables_the_settings_and_launcher_read():
    assert _variables_documented() == _variables_read()
