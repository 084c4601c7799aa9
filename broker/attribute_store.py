"""Writing attribute values (after they were checked), shared by the client and the
authority services."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from django.db import connection
from django.utils import timezone

from broker.models import AttributeValue, Authority, Client
from broker.prepared import prepared_cursor
from broker.seals import seal_attestations, store_seals

# What a new value replaces of the one a client had for that attribute: everything,
# its revocation and seal included.
INSERTED = f"""
INSERT INTO {AttributeValue._meta.db_table}
    (client_id, name, value, source, authority_id, set_at, expires_at, revoked_at,
     revoked_by)
"""
REPLACING = """
ON CONFLICT (client_id, name) DO UPDATE SET
    value = EXCLUDED.value, source = EXCLUDED.source, authority_id = EXCLUDED.authority_id,
    set_at = EXCLUDED.set_at, expires_at = EXCLUDED.expires_at, revoked_at = NULL,
    revoked_by = '', seal = NULL
"""

# One statement for any number of clients: the same values for each listed client, an
# upsert on the one value per client and attribute. SQL rather than bulk_create, which
# builds a model instance per row: for a trust officer's 10,000 clients that was most
# of the time spent.
UPSERT_VALUES = f"""{INSERTED}
SELECT client.id, given.key, given.value, %(source)s, %(authority)s, %(now)s,
       %(expires_at)s, NULL, ''
FROM unnest(%(clients)s::bigint[]) AS client(id)
CROSS JOIN jsonb_each(%(values)s::jsonb) AS given
{REPLACING}"""


# The values each client states about itself, any number of clients in one statement
# (the updates waiting in a web process are written together).
UPSERT_STATED = f"""{INSERTED}
SELECT stated.client_id, given.key, given.value, '{AttributeValue.Source.CLIENT}', NULL,
       %(now)s, NULL, NULL, ''
FROM unnest(%(clients)s::bigint[], %(values)s::text[]) AS stated(client_id, document)
CROSS JOIN jsonb_each(stated.document::jsonb) AS given
{REPLACING}"""


def write_stated_values(values_of: Mapping[int, Mapping[str, Any]]) -> None:
    """Set the values each client (by id) states about itself, in one statement."""
    parameters = {
        "clients": list(values_of),
        "values": [json.dumps(dict(values)) for values in values_of.values()],
        "now": timezone.now(),
    }
    with prepared_cursor() as cursor:
        cursor.execute(UPSERT_STATED, parameters)


def write_values(
    client: Client,
    values: Mapping[str, Any],
    *,
    source: str,
    authority: Authority | None = None,
    expires_at: datetime | None = None,
    seals: dict[str, dict] | None = None,
) -> None:
    """Set the client's values, with their provenance, in one statement; `seals`: the
    authority's own signatures of them (broker.seals.authority_seals), kept as given."""
    write_values_of_clients(
        [client.pk], values, source=source, authority=authority, expires_at=expires_at,
        seals=seals,
    )  # fmt: skip


def write_values_of_clients(
    client_ids: Iterable[int],
    values: Mapping[str, Any],
    *,
    source: str,
    authority: Authority | None = None,
    expires_at: datetime | None = None,
    seals: dict[str, dict] | None = None,
) -> None:
    """Set the same values, with their provenance, on every listed client, in one
    statement whatever their number; an authority's are signed for each client if the
    console holds its key (broker.seals)."""
    parameters = {
        "clients": list(client_ids),
        "values": json.dumps(dict(values)),
        "source": source,
        "authority": authority.pk if authority else None,
        "now": timezone.now(),
        "expires_at": expires_at,
    }
    with connection.cursor() as cursor:
        cursor.execute(UPSERT_VALUES, parameters)
    if seals is not None:
        [client_id] = parameters["clients"]
        store_seals(client_id=client_id, seals=seals)
    elif authority is not None:
        seal_attestations(authority=authority, client_ids=parameters["clients"])


def printable(values: Any) -> Any:
    """Values as they can be stored in an audit entry's JSON."""
    if isinstance(values, Mapping):
        return {
            str(k): v if isinstance(v, str | int | float | bool) else repr(v)
            for k, v in values.items()
        }
    return repr(values)
