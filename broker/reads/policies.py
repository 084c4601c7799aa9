"""Reads of receivers' policies: the newest version of each."""

from __future__ import annotations

from collections.abc import Iterable

from django.db import connection

from broker.models import (
    Client,
    PolicyVersion,
)
from broker.prepared import prepared_cursor

POLICY_FIELDS = [field.attname for field in PolicyVersion._meta.concrete_fields]
# Prepared: every agent's login states its policy, and this is how the same text again
# is found (compiling the ORM's query for it cost the web process more than running it).
CURRENT_POLICY = f"""
SELECT {", ".join(field.column for field in PolicyVersion._meta.concrete_fields)}
FROM {PolicyVersion._meta.db_table} WHERE client_id = %s ORDER BY version DESC LIMIT 1
"""


def current_policy(client: Client) -> PolicyVersion | None:
    """The client's newest policy version, or None if it never set one."""
    with prepared_cursor() as cursor:
        cursor.execute(CURRENT_POLICY, [client.pk])
        row = cursor.fetchone()
    return None if row is None else PolicyVersion.from_db(connection.alias, POLICY_FIELDS, row)


def newest_policies(
    client_ids: Iterable[int] | None = None, *, field: str = "canonical_text"
) -> dict[int, str]:
    """{client id: `field` of its newest policy version} for the clients given (or every
    client) that have one, in one query."""
    newest = PolicyVersion.objects.order_by("client_id", "-version").distinct("client_id")
    if client_ids is not None:
        newest = newest.filter(client_id__in=list(client_ids))
    return dict(newest.values_list("client_id", field))
