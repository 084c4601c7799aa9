"""Making PostgreSQL itself refuse writes, for tests of what happens when the database
fails: a trigger that raises, seen by every process (the web server's too), removed after."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connection

TRIGGER = "test_refuses_insert"
REFUSE = f"""
CREATE OR REPLACE FUNCTION {TRIGGER}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'this insert is refused by a test'; END $$
"""


@contextmanager
def inserts_refused(table: str, when: str = "true") -> Iterator[None]:
    """Every insert into `table` whose new row satisfies `when` fails, until the end."""
    with connection.cursor() as cursor:
        cursor.execute(REFUSE)
        cursor.execute(
            f"CREATE TRIGGER {TRIGGER} BEFORE INSERT ON {table} FOR EACH ROW "
            f"WHEN ({when}) EXECUTE FUNCTION {TRIGGER}()"
        )
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP TRIGGER IF EXISTS {TRIGGER} ON {table}")
