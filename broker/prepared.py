"""Cursors for the statements run for every delivery, login and hop, which PostgreSQL
keeps per connection instead of parsing them again at each run (and, on a connection
told to `plan_once`, planning them again).

Django binds parameters on the client (psycopg's ClientCursor), so every statement is
parsed and planned anew. Planning the confirmation's or the answer's CTE costs
PostgreSQL 0.3 to 0.5 ms, as much as running it: with two of them per answered delivery,
planning was a third of the database's work in a fleet round. A cursor binding on the
server lets psycopg prepare the statement on the connection's first run of it
(settings.DATABASE_PREPARED_STATEMENTS); the ORM's own statements are left as they are.
"""

from __future__ import annotations

import operator
import weakref
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from django.conf import settings
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


# Connections told to plan their prepared statements once (see `plan_once`).
_planning_once: weakref.WeakSet = weakref.WeakSet()


def plan_once() -> None:
    """From now on, the default connection plans each statement it prepares once, when
    first run, instead of choosing at every run (PostgreSQL's default): for a connection
    whose statements are written as index lookups whatever their arrays hold, as the
    tree's leaves' are. Left to choose, PostgreSQL planned the leaf's delivery insert
    again at every hop (0.5 ms): a plan for one-element arrays looked cheaper than a
    generic one. Not for every connection: the agents' batched answers run faster with
    plans made for the batch at hand.

    One round trip the first time on a connection. Outside a transaction only: a
    setting made inside one is undone if it rolls back."""
    if not settings.DATABASE_PREPARED_STATEMENTS or connection.in_atomic_block:
        return
    connection.ensure_connection()
    raw = connection.connection
    if raw in _planning_once:
        return
    with connection.cursor() as cursor:
        cursor.execute("SET plan_cache_mode = force_generic_plan")
    _planning_once.add(raw)


# Arrays as parameters -----------------------------------------------------------------
# psycopg dumps a list parameter element by element in Python (a dumper call and a
# regular expression each): for a leaf inserting its deliveries, a sixth of its time.
# These give PostgreSQL's text form of a one-dimensional array in one join, for a
# parameter cast to the array's type (`%s::bigint[]`); three times faster.


def int_array(values: Iterable[int]) -> str:
    """`values` (integers only: anything else raises TypeError) as an array literal."""
    return "{" + ",".join(map(str, map(operator.index, values))) + "}"


def text_array(values: Iterable[object]) -> str:
    """The `str()` of each of `values` as an array literal: every element quoted, its
    quotes and backslashes escaped (PostgreSQL's array input syntax), so any text
    stays one element; None is NULL (the text "NULL" is quoted, so stays text). For
    text, uuid, timestamp and jsonb arrays."""
    return "{" + ",".join(map(_quoted, values)) + "}"


def _quoted(value: object) -> str:
    if value is None:
        return "NULL"
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'
