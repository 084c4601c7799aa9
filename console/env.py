"""Strict readers for configuration taken from the environment.

Every reader names the variable in its error, so that a malformed value stops start-up
with a message an operator can act on ("DEBUG must be true or false, got 'maybe'")
instead of a silent default. This module imports nothing from Django: the launcher and
the settings module both use it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from urllib.parse import parse_qs, parse_qsl, unquote, urlencode, urlsplit

TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
FALSE_WORDS = frozenset({"0", "false", "no", "off"})
POSTGRES_SCHEMES = frozenset({"postgres", "postgresql", "pgsql"})
REDIS_SCHEMES = frozenset({"redis", "rediss", "unix"})
# libpq connection parameters a DATABASE_URL may give in its query, passed on to psycopg
# as they are: TLS above all (`?sslmode=verify-full&sslrootcert=/etc/ssl/pg-ca.pem`).
POSTGRES_URL_OPTIONS = frozenset({
    "sslmode", "sslrootcert", "sslcert", "sslkey", "sslcrl", "sslcrldir", "sslpassword",
    "sslcompression", "sslsni", "channel_binding", "gssencmode", "require_auth",
    "target_session_attrs", "application_name", "options", "keepalives",
    "keepalives_idle", "keepalives_interval", "keepalives_count", "tcp_user_timeout",
})  # fmt: skip


class ConfigurationError(Exception):
    """A configuration variable is missing or malformed; the message names it."""


def env_str(name: str, default: str | None = None) -> str:
    """Return the variable as text, or `default`; fail when neither exists."""
    value = os.environ.get(name, "").strip()
    if value:
        return value
    if default is None:
        raise ConfigurationError(f"{name} is not set and has no default.")
    return default


def env_bool(name: str, default: bool) -> bool:
    """Return the variable as a boolean; anything but true/false words is an error."""
    raw = os.environ.get(name, "").strip().lower()
    if not raw:
        return default
    if raw in TRUE_WORDS:
        return True
    if raw in FALSE_WORDS:
        return False
    raise ConfigurationError(f"{name} must be true or false (1/0, yes/no, on/off), got {raw!r}.")


def env_int(name: str, default: int, *, minimum: int = 0) -> int:
    """Return the variable as an integer no smaller than `minimum`."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigurationError(f"{name} must be a whole number, got {raw!r}.") from None
    if value < minimum:
        raise ConfigurationError(f"{name} must be at least {minimum}, got {value}.")
    return value


def env_choice(name: str, default: str, choices: frozenset[str]) -> str:
    """Return the variable (upper-cased) if it is one of `choices`."""
    value = env_str(name, default).upper()
    if value not in choices:
        raise ConfigurationError(
            f"{name} must be one of {', '.join(sorted(choices))}, got {value!r}."
        )
    return value


def env_list(name: str, default: list[str]) -> list[str]:
    """Return a comma-separated variable as a list of non-empty, stripped items."""
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return list(default)
    items = [item.strip() for item in raw.split(",")]
    if any(not item for item in items):
        raise ConfigurationError(f"{name} has an empty item in {raw!r}.")
    return items


@dataclass(frozen=True)
class DatabaseConfig:
    """The parts of a PostgreSQL URL that Django's DATABASES entry needs."""

    name: str
    user: str
    password: str
    host: str
    port: str
    options: dict[str, str] = field(default_factory=dict)  # libpq's, from the query

    def as_django(self, *, conn_max_age: int = 0) -> dict:
        """Return a Django DATABASES entry for psycopg 3."""
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": self.name,
            "USER": self.user,
            "PASSWORD": self.password,
            "HOST": self.host,
            "PORT": self.port,
            "CONN_MAX_AGE": conn_max_age,
            "CONN_HEALTH_CHECKS": True,
            "OPTIONS": dict(self.options),
        }


def parse_database_url(name: str, url: str) -> DatabaseConfig:
    """Parse a postgres:// URL; a socket directory may be given as `?host=/path`."""
    parts = urlsplit(url)
    if parts.scheme not in POSTGRES_SCHEMES:
        raise ConfigurationError(
            f"{name} must be a PostgreSQL URL (postgresql://user:password@host:port/name), "
            f"got scheme {parts.scheme!r}."
        )
    database = unquote(parts.path.lstrip("/"))
    if not database:
        raise ConfigurationError(f"{name} names no database (the path after the host).")
    query = parse_qs(parts.query)
    host = query.pop("host", [unquote(parts.hostname or "")])[0]
    unknown = sorted(set(query) - POSTGRES_URL_OPTIONS)
    if unknown:
        raise ConfigurationError(
            f"{name} has a query parameter libpq does not know here: {unknown[0]!r} "
            f"(host, or one of: {', '.join(sorted(POSTGRES_URL_OPTIONS))})."
        )
    try:
        port = str(parts.port or "")
    except ValueError:
        raise ConfigurationError(f"{name} has a port that is not a number.") from None
    return DatabaseConfig(
        name=database,
        user=unquote(parts.username or ""),
        password=unquote(parts.password or ""),
        host=host,
        port=port,
        options={key: values[-1] for key, values in query.items()},
    )


def check_redis_url(name: str, url: str) -> str:
    """Return `url` if it is a Redis URL (redis://, rediss:// or unix://)."""
    parts = urlsplit(url)
    if parts.scheme not in REDIS_SCHEMES:
        raise ConfigurationError(
            f"{name} must be a Redis URL (redis://host:port/db or unix:///path/redis.sock), "
            f"got scheme {parts.scheme!r}."
        )
    if parts.scheme == "unix" and not parts.path:
        raise ConfigurationError(f"{name} is a unix:// URL without a socket path.")
    if parts.scheme != "unix" and not parts.hostname:
        raise ConfigurationError(f"{name} names no host.")
    return url


def celery_broker_url_for(redis_url: str) -> str:
    """Translate a Redis URL into the form Celery's Redis transport expects."""
    parts = urlsplit(redis_url)
    if parts.scheme != "unix":
        return redis_url
    # Kombu spells a Redis unix socket as redis+socket:// and takes the database as the
    # query's virtual_host: a `db` there is overwritten with database 0.
    query = [("virtual_host" if k == "db" else k, v) for k, v in parse_qsl(parts.query)]
    return f"redis+socket://{parts.path}" + (f"?{urlencode(query)}" if query else "")
