"""The hot statements are prepared once per connection, and planned once where the
connection is told to (broker.prepared)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from django.db import DataError, connection, transaction
from django.test.utils import CaptureQueriesContext

from broker.models import Client
from broker.prepared import int_array, plan_once, prepared_cursor, text_array
from broker.reads.deliveries import LAST_POSITIONS, last_position_of
from tests.conftest import ROOT, environment_for_test_database

pytestmark = pytest.mark.django_db

SOME_CLIENT = Client(pk=1, name="web-00000")  # never saved: only its id is read


def prepared_statements() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        return [row[0] for row in cursor.fetchall()]


def test_a_statement_run_through_a_prepared_cursor_is_prepared_at_its_first_run():
    last_position_of(SOME_CLIENT)
    assert prepared_statements() == [LAST_POSITIONS.replace("%s", "$1")]


def test_running_it_again_reuses_the_one_prepared_statement():
    for _ in range(3):
        assert last_position_of(SOME_CLIENT) == 0
    assert len(prepared_statements()) == 1


def test_the_orm_and_plain_cursors_prepare_nothing():
    list(Client.objects.filter(pk=SOME_CLIENT.pk))
    for _ in range(3):
        with connection.cursor() as cursor:
            cursor.execute("SELECT %s::int", [1])
    assert prepared_statements() == []


def test_prepared_statements_are_logged_and_fail_with_djangos_errors():
    with CaptureQueriesContext(connection) as captured:
        for _ in range(2):  # prepared at the first run, reused at the second
            with prepared_cursor() as cursor:
                cursor.execute("SELECT %s::int + 1", [41])
                assert cursor.fetchone() == (42,)
    assert [query["sql"] for query in captured] == ["SELECT $1::int + 1"] * 2
    with pytest.raises(DataError), prepared_cursor() as cursor:
        cursor.execute("SELECT %s::int", ["not a number"])


ARRAY_STATEMENT = "SELECT count(*) FROM broker_client WHERE id = ANY(%s::bigint[])"


def plans_made_for(statement: str) -> tuple[int, int]:
    """(generic, custom) plans PostgreSQL made for `statement` on this connection."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement = %s",
            [statement.replace("%s", "$1")],
        )
        return cursor.fetchone()


def run_seven_times(statement: str) -> None:
    for _ in range(7):
        with prepared_cursor() as cursor:
            cursor.execute(statement, [[SOME_CLIENT.pk]])


@pytest.mark.django_db(transaction=True)
def test_a_connection_told_to_plan_once_plans_it_at_its_first_run_only():
    connection.close()  # a connection no earlier test told anything
    plan_once()
    plan_once()  # told twice: asked once
    # Left to choose, PostgreSQL makes a plan for the values at least at the first five
    # runs, and at every run while that looks cheaper (the leaf's insert did).
    run_seven_times(ARRAY_STATEMENT)
    assert plans_made_for(ARRAY_STATEMENT) == (7, 0)
    connection.close()  # later tests get a connection as the settings make it


@pytest.mark.django_db(transaction=True)
def test_inside_a_transaction_plan_once_changes_nothing():
    connection.close()
    with transaction.atomic():
        # A setting made in a transaction is undone if the transaction rolls back.
        plan_once()
    with connection.cursor() as cursor:
        cursor.execute("SHOW plan_cache_mode")
        assert cursor.fetchone() == ("auto",)


COUNT_PREPARED = """
from django.db import connection
from broker.models import Client
from broker.reads.deliveries import last_position_of
last_position_of(Client(pk=1))
with connection.cursor() as cursor:
    cursor.execute("SELECT count(*) FROM pg_prepared_statements")
    print(cursor.fetchone()[0])
"""


@pytest.mark.parametrize(("setting", "prepared"), [("true", "1"), ("false", "0")])
def test_the_setting_switches_preparing_on_and_off(setting, prepared):
    env = {**environment_for_test_database(), "DATABASE_PREPARED_STATEMENTS": setting}
    result = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "shell", "-c", COUNT_PREPARED],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert result.stdout.strip().splitlines()[-1] == prepared


ODD_TEXTS = ["plain", "", "NULL", "a,b", "{x}", 'say "hi"', "back\\slash\\", " lead", "\t", "é✓"]


def test_text_written_as_an_array_literal_reads_back_element_for_element():
    with prepared_cursor() as cursor:
        cursor.execute("SELECT %s::text[]", [text_array(ODD_TEXTS)])
        assert cursor.fetchone()[0] == ODD_TEXTS


def test_integers_written_as_an_array_literal_read_back_and_nothing_else_is_taken():
    with prepared_cursor() as cursor:
        cursor.execute("SELECT %s::bigint[]", [int_array([0, -1, 2**62])])
        assert cursor.fetchone()[0] == [0, -1, 2**62]
    with pytest.raises(TypeError):
        int_array([1, "2,3"])


def test_none_is_written_as_null_and_the_text_null_stays_text():
    values = [None, "NULL", "null", None, '{"a": [1, "b"]}']
    with prepared_cursor() as cursor:
        cursor.execute("SELECT %s::text[]", [text_array(values)])
        assert cursor.fetchone()[0] == values
        cursor.execute("SELECT %s::jsonb[]", [text_array([None, '{"a": "\\"x\\""}'])])
        null, document = cursor.fetchone()[0]  # Django reads jsonb as its text
        assert (null, json.loads(document)) == (None, {"a": '"x"'})
