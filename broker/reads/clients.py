"""Reads of clients and their tokens: models' declared types, live attribute values
(stated or attested) and the one rule of a token that still lets its client in."""

from __future__ import annotations

import json
import re
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from typing import Any

from django.db import connection
from django.db.models import Q, QuerySet
from django.db.models.functions import Now
from django.utils import timezone

from broker.credentials import key_digest
from broker.models import (
    AttributeValue,
    Client,
    ClientChange,
    ClientModel,
    ClientToken,
    ModelAttribute,
)
from broker.prepared import prepared_cursor


@dataclass(frozen=True)
class OwnAttributes:
    """A client's model's attributes as the client itself sees them: every declared
    attribute's type, those the client states itself, and the values it states now
    (live, lasting and its own; as canonical JSON text, so that 1, 1.0 and true differ)."""

    types: dict[str, str]
    self_stated: frozenset[str]
    stated: dict[str, str]


# One statement for what agents' advertisements and updates are checked against: one is
# sent at every login, and three ORM queries for it cost the web process more than the
# login itself (compiling them, not running them).
OWN_ATTRIBUTES = f"""
SELECT c.id, a.name, a.type, a.self_stated, v.value::text
FROM unnest(%s::bigint[], %s::bigint[]) AS c(id, model_id)
JOIN {ModelAttribute._meta.db_table} AS a ON a.model_id = c.model_id
LEFT JOIN {AttributeValue._meta.db_table} AS v
  ON v.client_id = c.id AND v.name = a.name AND v.source = '{AttributeValue.Source.CLIENT}'
  AND v.expires_at IS NULL AND v.revoked_at IS NULL
"""


def own_attributes(client: Client) -> OwnAttributes:
    """The client's `OwnAttributes`, in one prepared statement."""
    return own_attributes_of([client])[client.pk]


def own_attributes_of(clients: Iterable[Client]) -> dict[int, OwnAttributes]:
    """{client id: its `OwnAttributes`} for any number of clients, in one statement."""
    by_id = {client.pk: client for client in clients}
    rows_of: dict[int, list] = {client_id: [] for client_id in by_id}
    with prepared_cursor() as cursor:
        model_ids = [client.model_id for client in by_id.values()]
        cursor.execute(OWN_ATTRIBUTES, [list(by_id), model_ids])
        for client_id, *row in cursor.fetchall():
            rows_of[client_id].append(row)
    return {client_id: _own(rows) for client_id, rows in rows_of.items()}


def _own(rows: list) -> OwnAttributes:
    return OwnAttributes(
        types={name: type_name for name, type_name, _, _ in rows},
        self_stated=frozenset(name for name, _, self_stated, _ in rows if self_stated),
        stated={name: canonical_json(json.loads(value)) for name, _, _, value in rows if value},
    )


def canonical_json(value: Any) -> str:
    """`value` as JSON text that is equal for equal JSON values (keys sorted)."""
    return json.dumps(value, sort_keys=True)


def declared_types(client: Client) -> dict[str, str]:
    """{attribute name: type} of the client's model."""
    return dict(client.model.attributes.values_list("name", "type"))


def live_attribute_values(*, now=None) -> QuerySet[AttributeValue]:
    """Values that are neither revoked nor expired: the one rule for "current"."""
    now = now or timezone.now()
    return AttributeValue.objects.filter(revoked_at__isnull=True).filter(
        Q(expires_at__isnull=True) | Q(expires_at__gt=now)
    )


def live_values_of(client_ids: Iterable[int], names: Iterable[str]) -> dict[int, dict]:
    """{client id: {name: (value, expires_at)}} of the clients' live values of `names`,
    whoever set them: one query for any number of clients."""
    rows = live_attribute_values().filter(client_id__in=list(client_ids), name__in=list(names))
    return values_by_client(rows)


def values_by_client(rows: QuerySet[AttributeValue]) -> dict[int, dict]:
    found = defaultdict(dict)
    fields = ("client_id", "name", "value", "expires_at")
    for client_id, name, value, expires_at in rows.values_list(*fields):
        found[client_id][name] = (value, expires_at)
    return found


def live_values(client: Client, *, now=None) -> QuerySet[AttributeValue]:
    """The client's values that are neither revoked nor expired."""
    return live_attribute_values(now=now).filter(client=client)


def current_attributes(client: Client, *, now=None) -> dict:
    """Every live value, whoever set it: what selectors address."""
    return dict(live_values(client, now=now).values_list("name", "value"))


def attested_attributes(client: Client, *, now=None) -> dict:
    """Only values an authority attested: what receivers' policies see as `sender.x`."""
    return dict(_attested_values(client, now=now).values_list("name", "value"))


def _attested_values(client: Client | int, *, now=None) -> QuerySet[AttributeValue]:
    return live_values(client, now=now).filter(source=AttributeValue.Source.AUTHORITY)


# Stand-ins compiled into `attested_attributes_sql`, then named there.
_PROBES = {-1: "client", datetime(1901, 2, 3, tzinfo=UTC): "now"}


@dataclass(frozen=True)
class CompiledQuery:
    """An ORM query compiled once to SQL with named placeholders: those its runs fill
    in (say `%(client)s`), and its constants, bound in `constants`."""

    sql: str
    constants: dict[str, Any]


@cache
def attested_attributes_sql() -> CompiledQuery:
    """`attested_attributes` as SQL selecting (name, value, seal), for statements that read
    them in passing (publishing): its runs give %(client)s (an id) and %(now)s."""
    client, now = _PROBES
    query = _attested_values(client, now=now).values("name", "value", "seal").query
    sql, params = query.sql_with_params()
    names = [_PROBES.get(param, f"attested_{index}") for index, param in enumerate(params)]
    if sorted(set(_PROBES.values()) & set(names)) != ["client", "now"]:
        raise RuntimeError(f"attested_attributes compiles with parameters {params!r}")
    placeholders = iter(f"%({name})s" for name in names)
    constants = {n: p for n, p in zip(names, params, strict=True) if n not in _PROBES.values()}
    return CompiledQuery(re.sub("%s", lambda _: next(placeholders), sql), constants)


def declared_types_by_model(model_ids: Iterable[int]) -> dict[int, dict[str, str]]:
    """{model id: {attribute name: type}}, as `declared_types` for many models at once."""
    found = {model_id: {} for model_id in model_ids}
    rows = ModelAttribute.objects.filter(model_id__in=list(found))
    for model_id, name, type_name in rows.values_list("model_id", "name", "type"):
        found[model_id][name] = type_name
    return found


def model_names(model_ids: Iterable[int]) -> dict[int, str]:
    """{model id: its name}."""
    return dict(ClientModel.objects.filter(pk__in=list(model_ids)).values_list("pk", "name"))


def client_names(client_ids: Iterable[int]) -> dict[int, str]:
    """{client id: its name}, in one query."""
    return dict(Client.objects.filter(pk__in=list(client_ids)).values_list("pk", "name"))


def attributes_by_client(client_ids: Iterable[int] | None = None, *, now=None) -> dict:
    """{client id: {name: live value}} for the clients given (or every client), in one
    query; a client without live values maps to {}."""
    values = live_attribute_values(now=now)
    if client_ids is not None:
        values = values.filter(client_id__in=list(client_ids))
    by_client: dict[int, dict] = defaultdict(dict)
    for client_id, name, value in values.order_by("client_id", "name").values_list(
        "client_id", "name", "value"
    ):
        by_client[client_id][name] = value
    return by_client


def clients_with_attributes(query: QuerySet[Client], *, offset: int, limit: int) -> list[dict]:
    """A page of `query`'s clients, in its order, each with its model's name and its
    live attributes: two queries whatever the page's length."""
    page = list(query.select_related("model")[offset : offset + limit])
    attributes = attributes_by_client(client.pk for client in page) if page else {}
    return [
        {
            "name": client.name,
            "model": client.model.name,
            "can_send": client.can_send,
            "can_receive": client.can_receive,
            "is_active": client.is_active,
            "attributes": attributes.get(client.pk, {}),
        }
        for client in page
    ]


def live_tokens(token: str) -> QuerySet[ClientToken]:
    """The token's records that still let their client in (not revoked, not expired,
    client active): the one rule for logging in and for staying logged in."""
    return ClientToken.objects.filter(
        key_hash=key_digest(token),
        revoked_at__isnull=True,
        expires_at__gt=Now(),
        client__is_active=True,
    )


@cache
def live_token_ids_sql() -> str:
    """`live_tokens`' rule as SQL selecting the records' ids, taking one parameter: the
    token's `key_digest`. Compiled once: agents' logins and heartbeats are single
    statements built around it, and compiling the query each time cost them more than
    running it."""
    probe = ""
    sql, params = live_tokens(probe).values("pk").query.sql_with_params()
    if list(params) != [key_digest(probe)]:  # the rule gained a parameter: say so
        raise RuntimeError(f"live_tokens compiles with parameters {params!r}, not the digest")
    return sql


def client_named(name: str) -> Client | None:
    """The client of that name with its model, or None."""
    return Client.objects.select_related("model").filter(name=name).first()


def attribute_provenance(client: Client) -> list[AttributeValue]:
    """Every value the client has or had, with who set it and whether it still holds
    (`is_live`), by name."""
    now = timezone.now()
    values = list(client.attribute_values.select_related("authority").order_by("name"))
    for value in values:
        value.is_live = value.revoked_at is None and (
            value.expires_at is None or value.expires_at > now
        )
    return values


# The clients' change log (ClientChange): what the leaves and the console's directory
# read to stay fresh.


@dataclass(frozen=True)
class LogRead:
    """When a reader of the change log (a leaf's state, the console's directory) last
    read it: by this process's clock, and by the wall clock the changes' `at` are
    written by."""

    monotonic: float
    wall: datetime

    @classmethod
    def now(cls) -> LogRead:
        return cls(time.monotonic(), timezone.now())

    @property
    def since(self) -> datetime:
        """Whence the next read asks for changes (ClientChange.READ_OVERLAP)."""
        return self.wall - ClientChange.READ_OVERLAP

    def stale(self) -> bool:
        """Whether the log went unread long enough for retention to have dropped
        changes the next read would have had (ClientChange.STALE_AFTER_S): then the
        reader builds what it holds afresh instead."""
        return time.monotonic() - self.monotonic > ClientChange.STALE_AFTER_S


def clients_changed_since(horizon: int, dispatchers, *, last: LogRead) -> tuple[int, set[int]]:
    """(the next horizon, the clients whose changes at these dispatchers (ids, or a
    query of ids) were written by transactions at or above `horizon`): every change
    below the next horizon is committed and so seen by this read. `last`: the
    reader's last read."""
    following = snapshot_xmin()
    changes = ClientChange.objects.filter(
        dispatcher_id__in=dispatchers, txid__gte=horizon, at__gte=last.since
    )
    return following, set(changes.values_list("client_id", flat=True))


def snapshot_xmin() -> int:
    """PostgreSQL's oldest transaction still running: all before it have ended."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint")
        return cursor.fetchone()[0]
