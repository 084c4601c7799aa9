"""Turning a table into one partitioned by day, for the migrations that do it.

A migration's code is frozen with it, so this helper is its own copy of what
`lifecycle.partitions` does from then on (the partitions' names and ranges): a table
`T` partitioned by `KEY` has a partition `T_pYYYYMMDD` for each UTC day of KEY and a
default partition `T_default` for rows no day partition holds yet.

The table's rows are copied once into their days' partitions; its indexes, foreign
keys and triggers are made again on the partitioned table under the same names (its
primary key and unique constraints with KEY added: PostgreSQL enforces uniqueness per
partition only, and a key that holds KEY is unique across them).
"""

from __future__ import annotations

from datetime import date, timedelta

OLD = "{table}_unpartitioned"


def partition_by_day(
    cursor, *, table: str, key: str, key_column: str = "", key_from: str = "", keep: str = ""
):
    """Partition `table` by the day of `key`. When the table has no such column yet,
    `key_column` declares it and `key_from` is the SQL expression of each old row `t`
    that fills it (the rows of a table partitioned by a value copied from elsewhere).
    `keep`: the condition on an old row `t` for it to be kept (default: all are)."""
    old = OLD.format(table=table)
    shape = _shape(cursor, table)
    cursor.execute(f'ALTER TABLE "{table}" RENAME TO "{old}"')
    cursor.execute(f'ALTER TABLE "{old}" ALTER COLUMN id DROP IDENTITY IF EXISTS')
    extra = f", {key} {key_column}" if key_column else ""
    cursor.execute(
        f'CREATE TABLE "{table}" (LIKE "{old}" INCLUDING DEFAULTS INCLUDING CONSTRAINTS{extra})'
        f" PARTITION BY RANGE ({key})"
    )
    _number_rows_on(cursor, table, old)
    cursor.execute(f'CREATE TABLE "{table}_default" PARTITION OF "{table}" DEFAULT')
    select = f"t.*, {key_from} AS {key}" if key_column else "t.*"
    rows = f'SELECT {select} FROM "{old}" t WHERE {keep or "true"}'
    for day in _days(cursor, f"SELECT DISTINCT ({_day(key)}) FROM ({rows}) s"):
        create_day(cursor, table=table, key=key, day=day)
    cursor.execute(f'INSERT INTO "{table}" {rows}')
    cursor.execute(f'DROP TABLE "{old}"')
    _rebuild(cursor, table, key, shape)


def create_day(cursor, *, table: str, key: str, day: date) -> None:
    """The partition of `table` holding the rows whose `key` falls on `day` (UTC)."""
    cursor.execute(
        f'CREATE TABLE "{table}_p{day:%Y%m%d}" PARTITION OF "{table}"'
        f" FOR VALUES FROM ('{day.isoformat()} 00:00:00+00')"
        f" TO ('{(day + timedelta(days=1)).isoformat()} 00:00:00+00')"
    )


def _day(key: str) -> str:
    return f"({key} AT TIME ZONE 'UTC')::date"


def _days(cursor, query: str) -> list[date]:
    cursor.execute(query)
    return sorted(day for (day,) in cursor.fetchall() if day is not None)


def _number_rows_on(cursor, table: str, old: str) -> None:
    """Ids go on from the old table's (an identity column cannot be partitioned
    before PostgreSQL 17; a sequence owned by the column serves every version)."""
    sequence = f"{table}_id_seq"
    cursor.execute(f'CREATE SEQUENCE "{sequence}" OWNED BY "{table}".id')
    cursor.execute(f"ALTER TABLE \"{table}\" ALTER COLUMN id SET DEFAULT nextval('{sequence}')")
    cursor.execute(f'SELECT coalesce(max(id), 0) + 1 FROM "{old}"')
    cursor.execute(f"SELECT setval('{sequence}', %s, false)", [cursor.fetchone()[0]])


def _shape(cursor, table: str) -> dict[str, list]:
    """The table's indexes, constraints and triggers, as SQL to make them again."""
    cursor.execute(
        "SELECT i.relname, pg_get_indexdef(x.indexrelid), c.contype"
        " FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid"
        " LEFT JOIN pg_constraint c ON c.conindid = x.indexrelid AND c.conrelid = x.indrelid"
        " WHERE x.indrelid = %s::regclass ORDER BY i.relname",
        [table],
    )
    indexes = cursor.fetchall()
    cursor.execute(
        "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint"
        " WHERE conrelid = %s::regclass AND contype = 'f' ORDER BY conname",
        [table],
    )
    foreign = cursor.fetchall()
    cursor.execute(
        "SELECT pg_get_triggerdef(oid) FROM pg_trigger"
        " WHERE tgrelid = %s::regclass AND NOT tgisinternal ORDER BY tgname",
        [table],
    )
    triggers = [definition for (definition,) in cursor.fetchall()]
    return {"indexes": indexes, "foreign": foreign, "triggers": triggers}


def _rebuild(cursor, table: str, key: str, shape: dict[str, list]) -> None:
    for name, definition, kind in shape["indexes"]:
        if kind in ("p", "u"):
            columns = definition[definition.index("(") + 1 : definition.rindex(")")]
            clause = "PRIMARY KEY" if kind == "p" else "UNIQUE"
            cursor.execute(
                f'ALTER TABLE "{table}" ADD CONSTRAINT "{name}" {clause} ({columns}, {key})'
            )
        else:
            cursor.execute(definition)  # read before the rename: it names the new table
    for name, definition in shape["foreign"]:
        cursor.execute(f'ALTER TABLE "{table}" ADD CONSTRAINT "{name}" {definition}')
    for definition in shape["triggers"]:
        cursor.execute(definition)
