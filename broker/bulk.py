"""Writing many rows at once with PostgreSQL's COPY, for loading fleets of 100,000."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from django.db import connection, models


def copy_rows(model: type[models.Model], fields: Sequence[str], rows: Iterable[Sequence]) -> None:
    """Insert `rows` (values of `fields`, in that order; a foreign key by its id) into
    `model`'s table, inside the caller's transaction.

    COPY skips what a save() does: no defaults computed in Python (give every field
    without a database default), no auto_now, no signals, and a JSON field takes its
    JSON text. Columns left out take their database default (ids, db_default)."""
    quote = connection.ops.quote_name
    columns = ", ".join(quote(model._meta.get_field(name).column) for name in fields)
    statement = f"COPY {quote(model._meta.db_table)} ({columns}) FROM STDIN"
    with connection.cursor() as cursor, cursor.cursor.copy(statement) as copy:
        for row in rows:
            copy.write_row(row)
