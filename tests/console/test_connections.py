"""A web process closes each HTTP request's database connections when the request ends
(console.middleware.CloseDatabaseConnections), through a real web process."""

from __future__ import annotations

import time
import urllib.error
import urllib.request

import pytest
from django.db import connection

pytestmark = pytest.mark.django_db(transaction=True)

APPLICATION_NAME = "sn-test-request-connections"
REQUESTS = 40


def connections_named(name: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", [name])
        return cursor.fetchone()[0]


def get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as error:  # 503 without tree workers: still a query
        return error.code


def test_a_web_process_keeps_no_database_connection_after_its_requests_end(serve_console):
    # libpq names every connection of that process (PGAPPNAME), so that only its
    # connections are counted, whatever else the test database serves.
    with serve_console({"PGAPPNAME": APPLICATION_NAME}) as base_url:
        statuses = {get(f"{base_url}/healthz.json") for _ in range(REQUESTS)}
        assert statuses <= {200, 503}
        deadline = time.monotonic() + 5
        while connections_named(APPLICATION_NAME) and time.monotonic() < deadline:
            time.sleep(0.1)
        # Before: a connection per request, open until the collector found it.
        assert connections_named(APPLICATION_NAME) == 0
