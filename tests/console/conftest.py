"""The console's cast: one user per role, logged in with Django's test client."""

from __future__ import annotations

import pytest

from broker.reads.directory import forget_directory
from console.health import redis_client
from console.processes import KEY_PREFIX
from tests.cast import (
    AUDITOR,
    OPERATOR,
    POLICY_AUTHOR,
    TRUST_OFFICER,
    create_member,
    log_in_proved,
)


@pytest.fixture(autouse=True)
def fresh_directory_per_test():
    """The directory is per process; each test's database starts anew."""
    forget_directory()
    yield
    forget_directory()


@pytest.fixture
def no_announcements():
    """The test's own process announcements only (those of the suite's workers are
    cleared before and after it)."""

    def clear() -> None:
        client = redis_client()
        for key in client.scan_iter(f"{KEY_PREFIX}*"):
            client.delete(key)

    clear()
    yield
    clear()


def logged_in(client, member):
    """`client` logged in as `member` (created now), their second factor proved."""
    return log_in_proved(client, create_member(member))


@pytest.fixture
def as_operator(client):
    return logged_in(client, OPERATOR)


@pytest.fixture
def as_author(client):
    return logged_in(client, POLICY_AUTHOR)


@pytest.fixture
def as_officer(client):
    return logged_in(client, TRUST_OFFICER)


@pytest.fixture
def as_auditor(client):
    return logged_in(client, AUDITOR)
