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
    with connection.cursor() as cursor, cursor.cursor.copy(_statement(model, fields)) as copy:
        for row in rows:
            copy.write_row(row)


def copy_text(model: type[models.Model], fields: Sequence[str], blocks: Iterable[str]) -> None:
    """As copy_rows, from text already in COPY's text format: lines of tab-separated
    values, `\\N` for null, each value passed through copy_escape. For the tables so
    large (millions of synthetic deliveries) that adapting each value in Python costs
    more than writing its line; `blocks` are many lines each."""
    with connection.cursor() as cursor, cursor.cursor.copy(_statement(model, fields)) as copy:
        for block in blocks:
            copy.write(block)


NULL = "\\N"
_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def copy_escape(text: str) -> str:
    """`text` as one value of a COPY text line."""
    return text.translate(_ESCAPES)


def _statement(model: type[models.Model], fields: Sequence[str]) -> str:
    quote = connection.ops.quote_name
    columns = ", ".join(quote(model._meta.get_field(name).column) for name in fields)
    return f"COPY {quote(model._meta.db_table)} ({columns}) FROM STDIN"
