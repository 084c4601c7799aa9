"""Migrating a database that holds deliveries, hops and client changes (broker
migrations 0026 and 0028): every row lands in its day's partition (a delivery with its
event's expiry; of the client changes, the last two days'), ids go on where they were,
and the constraints hold across partitions."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from tests.conftest import ROOT, environment_for_test_database

pytestmark = pytest.mark.django_db

DAYS = [datetime(2026, 3, d, 12, 0, tzinfo=UTC) for d in (1, 2, 2, 5)]  # the events' expiries
RECEIVERS = 3


@pytest.fixture
def database_before_partitions():
    """A database of its own on the test server, migrated to just before 0026."""
    env = environment_for_test_database()
    source = env["DATABASE_URL"]
    name = "migration_0026"
    with psycopg.connect(source, autocommit=True) as connection:
        connection.execute(f"DROP DATABASE IF EXISTS {name}")
        connection.execute(f"CREATE DATABASE {name}")
    url = source.replace(source.split("?")[0].rsplit("/", 1)[1], name, 1)
    # The roles are synchronised after a migration once the broker's and the reports'
    # permissions both exist: the reports' tables first (that first run's sync fails,
    # the broker's being missing), then the broker's up to 0025.
    migrate(url, "reports", check=False)
    migrate(url, "broker", "0025")
    yield url
    with psycopg.connect(source, autocommit=True) as connection:
        connection.execute(f"DROP DATABASE {name} WITH (FORCE)")


def migrate(url: str, *target: str, check: bool = True) -> None:
    env = {**environment_for_test_database(), "DATABASE_URL": url}
    subprocess.run(
        [sys.executable, "manage.py", "migrate", *target, "-v0"],
        cwd=ROOT, env=env, check=check, timeout=300, capture_output=not check,
    )  # fmt: skip


def populate(connection) -> None:
    """Events expiring on DAYS, each delivered to every receiver, with a hop each."""
    run = connection.execute
    model = run(
        "INSERT INTO broker_clientmodel (name, description, created_at)"
        " VALUES ('web-server', '', now()) RETURNING id"
    ).fetchone()[0]
    leaf = run(
        "INSERT INTO broker_dispatcher (name, depth, is_leaf) VALUES ('d0', 0, true) RETURNING id"
    ).fetchone()[0]
    clients = [
        run(
            "INSERT INTO broker_client (name, can_send, can_receive, secret_hash, is_active,"
            " created_at, model_id, dispatcher_id) VALUES (%s, true, true, '', true, now(), %s, %s)"
            " RETURNING id",
            [f"web-{n}", model, leaf],
        ).fetchone()[0]
        for n in range(RECEIVERS)
    ]
    for client, days in zip(clients, (40, 3), strict=False):  # their history, by trigger
        run(
            "INSERT INTO broker_attributevalue (client_id, name, value, source, set_at,"
            " revoked_by) VALUES (%s, 'region', '\"eu\"', 'client', now() - %s, '')",
            [client, timedelta(days=days)],
        )
    for age in (timedelta(days=5), timedelta(minutes=5)):  # the first is read long ago
        run(
            "INSERT INTO broker_clientchange (client_id, dispatcher_id, at)"
            " VALUES (%s, %s, now() - %s)",
            [clients[0], leaf, age],
        )
    for sequence, expires in enumerate(DAYS, start=1):
        event = run(
            "INSERT INTO broker_event (id, channel, sequence, content, selector, sender_attributes,"
            " lifetime_s, published_at, expires_at, sender_id, idempotency_key)"
            " VALUES (gen_random_uuid(), 'c', %s, '{}', '', '{}', 60, %s, %s, %s, '') RETURNING id",
            [sequence, expires - timedelta(minutes=1), expires, clients[0]],
        ).fetchone()[0]
        for position, receiver in enumerate(clients, start=sequence * 10):
            run(
                "INSERT INTO broker_delivery (event_id, receiver_id, sender_id, channel, sequence,"
                " position, state, delivered_at) VALUES (%s, %s, %s, 'c', %s, %s, 'acked', %s)",
                [event, receiver, clients[0], sequence, position, expires],
            )
        run(
            "INSERT INTO broker_trafficrecord (event_id, dispatcher_id, direction, forwarded_to,"
            " delivered, wasted, at) VALUES (%s, %s, 'down', '[]', %s, 0, %s)",
            [event, leaf, RECEIVERS, expires - timedelta(seconds=30)],
        )


HISTORY_BY_DAY = "SELECT client_id, name, kind, at, txid FROM broker_attributehistory ORDER BY id"


def test_a_populated_database_migrates_into_day_partitions_losing_nothing(
    database_before_partitions,
):
    url = database_before_partitions
    with psycopg.connect(url, autocommit=True) as connection:
        populate(connection)
        before = connection.execute("SELECT max(id), count(*) FROM broker_delivery").fetchone()
        history = connection.execute(HISTORY_BY_DAY).fetchall()

    migrate(url)

    with psycopg.connect(url, autocommit=True) as connection:
        run = connection.execute
        assert run("SELECT max(id), count(*) FROM broker_delivery").fetchone() == before
        assert run(
            "SELECT count(*) FROM broker_delivery d JOIN broker_event e ON e.id = d.event_id"
            " WHERE d.expires_at = e.expires_at"
        ).fetchone() == (len(DAYS) * RECEIVERS,)
        partitions = run(
            "SELECT tableoid::regclass::text, count(*) FROM broker_delivery GROUP BY 1 ORDER BY 1"
        ).fetchall()
        assert partitions == [
            ("broker_delivery_p20260301", 3),
            ("broker_delivery_p20260302", 6),
            ("broker_delivery_p20260305", 3),
        ]
        assert run(HISTORY_BY_DAY).fetchall() == history and len(history) == 2
        assert run(
            "SELECT count(*) FROM broker_attributehistory WHERE tableoid::regclass::text"
            " = 'broker_attributehistory_p' || to_char(at AT TIME ZONE 'UTC', 'YYYYMMDD')"
        ).fetchone() == (2,)
        hops = run("SELECT DISTINCT tableoid::regclass::text FROM broker_trafficrecord").fetchall()
        assert len(hops) == 3 and ("broker_trafficrecord_default",) not in hops
        (changes,) = run("SELECT tableoid::regclass::text, at FROM broker_clientchange").fetchall()
        assert changes[0] == f"broker_clientchange_p{changes[1]:%Y%m%d}"  # the recent one
        # New rows are numbered after the old ones, and an event's receiver still
        # gets one delivery only, whichever partition.
        event, receiver, sender = run(
            "SELECT event_id, receiver_id, sender_id FROM broker_delivery LIMIT 1"
        ).fetchone()
        with pytest.raises(psycopg.errors.UniqueViolation):
            run(
                "INSERT INTO broker_delivery (event_id, receiver_id, sender_id, channel,"
                " sequence, position, state, expires_at, delivered_at)"
                " SELECT %s, %s, %s, 'c', 1, 999, 'pending', expires_at, now()"
                " FROM broker_event WHERE id = %s",
                [event, receiver, sender, event],
            )
        fresh = run(
            "INSERT INTO broker_delivery (event_id, receiver_id, sender_id, channel, sequence,"
            " position, state, expires_at, delivered_at) VALUES (%s, %s, %s, 'c', 9, 1000,"
            " 'pending', now(), now()) RETURNING id",
            [event, receiver, sender],
        ).fetchone()[0]
        assert fresh > before[0]
