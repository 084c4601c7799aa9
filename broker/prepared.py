"""Cursors for the statements run for every delivery, login and hop, whose plans
PostgreSQL keeps per connection instead of making them again at each run.

Django binds parameters on the client (psycopg's ClientCursor), so every statement is
parsed and planned anew. Planning the confirmation's or the answer's CTE costs
PostgreSQL 0.3 to 0.5 ms, as much as running it: with two of them per answered delivery,
planning was a third of the database's work in a fleet round. A cursor binding on the
server lets psycopg prepare the statement on the connection's first run of it
(settings.DATABASE_PREPARED_STATEMENTS); the ORM's own statements are left as they are.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connection
from django.db.backends.postgresql.base import ServerBindingCursor
from django.db.backends.utils import CursorWrapper


class _ServerBindingCursor(ServerBindingCursor):
    """Django logs a query from the cursor's `_query`, which psycopg sets when it sends
    a statement unprepared and leaves unset when it runs a prepared one: the log said
    None for every statement here. This sets it in both cases."""

    def _send_query_prepared(self, name, pgq, *, binary=None) -> None:
        self._query = pgq
        super()._send_query_prepared(name, pgq, binary=binary)


@contextmanager
def prepared_cursor() -> Iterator[CursorWrapper]:
    """A cursor of the default connection binding its parameters on the server, wrapped
    as Django wraps its own (errors translated, queries logged where they are).

    Only for statements whose parameters PostgreSQL can type: a bare `%s` that could be
    anything needs a cast (`%s::text`)."""
    connection.ensure_connection()
    raw = _ServerBindingCursor(connection.connection)
    # Django's own wrapping of a new cursor (BaseDatabaseWrapper.cursor() does the same).
    with connection._prepare_cursor(raw) as cursor:
        yield cursor
