"""Client models, clients, their credentials and their self-stated attributes."""

from __future__ import annotations

import hmac
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.contrib.auth.hashers import check_password
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from broker import audit
from broker.attribute_store import printable, write_stated_values
from broker.attributes import check_values
from broker.audit import Actor
from broker.credentials import key_digest, new_secret, token_expiry
from broker.dispatch import entry
from broker.errors import AuthenticationFailed, BrokerError, InvalidInput, NotAuthorised
from broker.models import Client, ClientModel, ClientToken, ModelAttribute
from broker.prepared import prepared_cursor, text_array
from broker.push import to_agents
from broker.reads.clients import (
    OwnAttributes,
    canonical_json,
    live_token_ids_sql,
    own_attributes,
    own_attributes_of,
)
from broker.services.tree import attach_to_leaf
from policies import AttributeType

# A client's name; the HTTP API's schema states the same pattern.
CLIENT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


@dataclass(frozen=True)
class AttributeSpec:
    """How a model declares one attribute."""

    name: str
    type: str
    self_stated: bool = True


def create_client_model(
    *, name: str, attributes: Iterable[AttributeSpec], actor: Actor, description: str = ""
) -> ClientModel:
    """Create a model and its typed attributes. A name has one type across all models
    (the service's vocabulary, docs/addressing.md): a name another model declares with
    another type is refused, naming that model."""
    specs = list(attributes)
    with audit.refusals_recorded(actor=actor, action="model.create", target=f"model:{name}"):
        _check_specs(specs)
    with transaction.atomic():
        _serialise_model_creation()
        with audit.refusals_recorded(actor=actor, action="model.create", target=f"model:{name}"):
            _refuse_other_types(specs)
        model = ClientModel.objects.create(name=name, description=description)
        ModelAttribute.objects.bulk_create(
            ModelAttribute(model=model, name=s.name, type=s.type, self_stated=s.self_stated)
            for s in specs
        )
        audit.record_change(
            actor=actor,
            action="model.create",
            target=f"model:{name}",
            details={"attributes": {s.name: s.type for s in specs}},
        )
    return model


def _check_specs(specs: list[AttributeSpec]) -> None:
    types = {t.value for t in AttributeType}
    seen = set()
    for spec in specs:
        if spec.type not in types:
            raise InvalidInput(
                f"{spec.name} has unknown type {spec.type!r} (use one of {sorted(types)})",
                field=spec.name,
            )
        if spec.name in seen:
            raise InvalidInput(f"{spec.name} is declared twice", field=spec.name)
        seen.add(spec.name)


MODEL_CREATION_LOCK = 0x6D0DE1  # pg_advisory_xact_lock key: one model created at a time


def _serialise_model_creation() -> None:
    """Two models declaring one name with two types at once must not both pass."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [MODEL_CREATION_LOCK])


def _refuse_other_types(specs: list[AttributeSpec]) -> None:
    declared = ModelAttribute.objects.filter(name__in=[s.name for s in specs]).select_related(
        "model"
    )
    types = {spec.name: spec.type for spec in specs}
    for other in declared.order_by("model__name"):
        if other.type != types[other.name]:
            raise InvalidInput(
                f"{other.name} is already declared as {other.type} by model "
                f"{other.model.name!r}; a name has one type across all models, so that "
                f"selectors and policies mean one thing by it: declare {other.name} as "
                f"{other.type}, or use another name",
                field=other.name,
            )


def register_client(
    *, name: str, model: ClientModel, can_send: bool, can_receive: bool, actor: Actor
) -> tuple[Client, str]:
    """Create a client attached to the least-loaded leaf; return it and its secret.

    The secret is returned this once and stored only as a hash.
    """
    _check_client_name(name)
    secret = new_secret("sns")
    try:
        with transaction.atomic():
            client = Client.objects.create(
                name=name,
                model=model,
                can_send=can_send,
                can_receive=can_receive,
                # A 256-bit random secret cannot be guessed, so a fast digest protects
                # it as well as a slow password hash would, and registering a fleet of
                # thousands takes seconds rather than minutes.
                secret_hash=key_digest(secret),
                dispatcher=attach_to_leaf(),
            )
            audit.record_change(actor=actor, action="client.register", target=f"client:{name}")
            entry.client_changed(client)
    except IntegrityError:
        raise InvalidInput(f"a client named {name!r} already exists", field="name") from None
    return client, secret


def _check_client_name(name: Any) -> None:
    # Names appear in URLs (/clients/NAME/tokens), on command lines and in the console.
    if not isinstance(name, str) or not CLIENT_NAME.fullmatch(name):
        raise InvalidInput(
            "a client name is 1-128 letters, digits, '-', '_' or '.', starting with a "
            "letter or digit",
            field="name",
        )


def log_in_client(*, name: str, secret: str) -> str:
    """Exchange a client's name and secret for a new revocable token."""
    client = Client.objects.filter(name=name, is_active=True).first()
    if client is None or not _secret_matches(secret, client.secret_hash):
        audit.record_refusal(
            actor=Actor("client", name),
            action="client.login",
            target=f"client:{name}",
            reason="unknown client or wrong secret",
        )
        raise AuthenticationFailed("unknown client or wrong secret")
    token = new_secret("snt")
    ClientToken.objects.create(client=client, key_hash=key_digest(token), expires_at=_expiry())
    return token


def issue_token(*, client: Client, actor: Actor) -> str:
    """A new token for `client`, made by an operator or the system for an agent that is
    provisioned rather than typed in (the fleet, an integration); shown once."""
    token = new_secret("snt")
    with transaction.atomic():
        ClientToken.objects.create(client=client, key_hash=key_digest(token), expires_at=_expiry())
        target = f"client:{client.name}"
        audit.record_change(actor=actor, action="client.issue_token", target=target)
    return token


def issue_fleet_tokens(*, clients: list[Client], actor: Actor) -> dict[int, str]:
    """Provision a fleet in one transaction: revoke the clients' earlier tokens and
    issue one new token each; return {client id: token}. Audited as one change."""
    tokens = {client.pk: new_secret("snt") for client in clients}
    with transaction.atomic():
        ClientToken.objects.filter(client__in=clients, revoked_at__isnull=True).update(
            revoked_at=timezone.now()
        )
        expires_at = _expiry()
        ClientToken.objects.bulk_create(
            ClientToken(client_id=pk, key_hash=key_digest(token), expires_at=expires_at)
            for pk, token in tokens.items()
        )
        audit.record_change(
            actor=actor,
            action="client.issue_fleet_tokens",
            target=f"clients:{len(clients)}",
            details={"clients": [client.name for client in clients][: audit.MAX_LISTED_NAMES]},
        )
    return tokens


def _expiry():
    """When a client's token issued now stops working."""
    return token_expiry(settings.CLIENT_TOKEN_DAYS)


def _secret_matches(secret: str, stored: str) -> bool:
    if "$" in stored:  # a password-hasher hash, as stored before secrets were digests
        return check_password(secret, stored)
    return hmac.compare_digest(key_digest(secret), stored)


def authenticate_client(token: str) -> Client:
    """The active client a live token belongs to, with its model; else
    AuthenticationFailed. The token is marked used."""
    (client,) = authenticate_clients([token])
    if client is None:
        raise token_refused()
    return client


def token_refused() -> AuthenticationFailed:
    """The refusal of a token that lets nobody in (it says no more than that)."""
    return AuthenticationFailed("the token is unknown, revoked or expired")


def authenticate_clients(tokens: list[str]) -> list[Client | None]:
    """`authenticate_client` for many tokens in one statement (a fleet logging in):
    for each, in order, its client with its model, or None if it lets nobody in."""
    with prepared_cursor() as cursor:  # one statement: its own transaction
        cursor.execute(
            USE_TOKENS.format(live=live_token_ids_sql().replace("%s", "input.digest")),
            [text_array(key_digest(token) for token in tokens)],
        )
        found = {row[0]: row[1:] for row in cursor.fetchall()}
    return [_client_of(found.get(ordinal)) for ordinal in range(1, len(tokens) + 1)]


def _client_of(row: tuple | None) -> Client | None:
    if row is None:
        return None
    client = Client.from_db(connection.alias, CLIENT_FIELDS, row[: len(CLIENT_FIELDS)])
    client.model = ClientModel.from_db(connection.alias, MODEL_FIELDS, row[len(CLIENT_FIELDS) :])
    return client


CLIENT_FIELDS = [field.attname for field in Client._meta.concrete_fields]
MODEL_FIELDS = [field.attname for field in ClientModel._meta.concrete_fields]

# Tokens' use in one statement (a login is a reconnect storm's unit of work): for each
# token (by its ordinal), its record, if it still lets its client in, marked used (at
# most once a minute: when a token was last used is shown for people to read, and a
# fleet logging in again after an outage would otherwise write a row for each of its
# agents); its client and the client's model.
USE_TOKENS = f"""
WITH input AS (
    SELECT * FROM unnest(%s::text[]) WITH ORDINALITY AS i(digest, ord)
), live AS (
    SELECT input.ord, t.id, t.client_id, t.last_used_at
    FROM input
    CROSS JOIN LATERAL ({{live}}) AS found (id)
    JOIN {ClientToken._meta.db_table} AS t ON t.id = found.id
), used AS (
    UPDATE {ClientToken._meta.db_table} SET last_used_at = now()
    WHERE id IN (
        SELECT id FROM live
        WHERE last_used_at IS NULL OR last_used_at < now() - interval '1 minute'
    )
)
SELECT live.ord,
       {", ".join(f"c.{field.column}" for field in Client._meta.concrete_fields)},
       {", ".join(f"m.{field.column}" for field in ClientModel._meta.concrete_fields)}
FROM live
JOIN {Client._meta.db_table} AS c ON c.id = live.client_id
JOIN {ClientModel._meta.db_table} AS m ON m.id = c.model_id
"""


def revoke_tokens(*, client: Client, actor: Actor) -> int:
    """Revoke every live token of `client`; return how many."""
    with transaction.atomic():
        count = client.tokens.filter(revoked_at__isnull=True).update(revoked_at=timezone.now())
        audit.record_change(
            actor=actor,
            action="client.revoke_tokens",
            target=f"client:{client.name}",
            details={"revoked": count},
        )
        # Connected sessions end too: a revoked token must not keep a socket open.
        # robust: if Redis is down the revocation still stands (and is answered); the
        # failure is logged.
        transaction.on_commit(lambda: to_agents.end_sessions(client.pk), robust=True)
    return count


def revoke_token(*, token: ClientToken, actor: Actor) -> None:
    """Revoke one token of a client (audited); the client's sessions end, and its
    agents log in again with a token still live, if they have one."""
    with transaction.atomic():
        ClientToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(
            revoked_at=timezone.now()
        )
        audit.record_change(
            actor=actor,
            action="client.revoke_token",
            target=f"client:{token.client.name}",
            details={"token": token.pk},
        )
        client_id = token.client_id
        transaction.on_commit(lambda: to_agents.end_sessions(client_id), robust=True)


def revoke_tokens_of(*, clients: list[Client], actor: Actor) -> int:
    """Revoke every live token of these clients (a bulk action); return how many.
    Audited as one change naming the clients; their sessions end."""
    ids = [client.pk for client in clients]
    with transaction.atomic():
        count = ClientToken.objects.filter(client_id__in=ids, revoked_at__isnull=True).update(
            revoked_at=timezone.now()
        )
        audit.record_change(
            actor=actor,
            action="client.revoke_tokens",
            target=f"clients:{len(ids)}",
            details={"revoked": count, "clients": audit.listed([c.name for c in clients])},
        )
        transaction.on_commit(lambda: to_agents.end_sessions_of(ids), robust=True)
    return count


def set_clients_active(*, clients: list[Client], active: bool, actor: Actor) -> int:
    """Deactivate (or reactivate) clients: an inactive client cannot log in, send or
    receive, and its sessions end. Returns how many changed; audited as one change."""
    changing = [client for client in clients if client.is_active != active]
    action = "client.activate" if active else "client.deactivate"
    with transaction.atomic():
        Client.objects.filter(pk__in=[c.pk for c in changing]).update(is_active=active)
        audit.record_change(
            actor=actor,
            action=action,
            target=f"clients:{len(changing)}",
            details={"clients": audit.listed([c.name for c in changing])},
        )
        entry.clients_changed(changing)
        if not active:
            ids = [client.pk for client in changing]
            transaction.on_commit(lambda: to_agents.end_sessions_of(ids), robust=True)
    return len(changing)


@dataclass(frozen=True)
class StatedValues:
    """Values a client states about itself, as `actor`."""

    client: Client
    values: Mapping[str, Any]
    actor: Actor


def state_attributes(
    *, client: Client, values: Mapping[str, Any], actor: Actor, own: OwnAttributes | None = None
) -> None:
    """Apply values the client states about itself: all of them, or none.

    Attributes its model reserves for authorities are refused, with an audit entry,
    and then none of the other values is applied either. `own` is the client's
    `own_attributes`, when the caller has read them already.
    """
    stated = StatedValues(client, values, actor)
    checked = _checked(stated, own or own_attributes(client))
    if checked is not None:
        _write_stated([(stated, checked)])


def state_attributes_of_clients(
    all_stated: list[StatedValues], *, owns: Mapping[int, OwnAttributes] | None = None
) -> list[BrokerError | None]:
    """`state_attributes` for many clients at once (the updates waiting in a web
    process, one per client): each is checked on its own, and answered with its
    refusal (audited) or None; the accepted ones are written in one transaction.
    `owns` is {client id: its `OwnAttributes`}, when the caller has read them."""
    if owns is None:
        owns = own_attributes_of(stated.client for stated in all_stated)
    outcomes: list[BrokerError | None] = []
    accepted = []
    for stated in all_stated:
        try:
            checked = _checked(stated, owns[stated.client.pk])
        except BrokerError as error:
            outcomes.append(error)
            continue
        outcomes.append(None)
        if checked is not None:
            accepted.append((stated, checked))
    if accepted:
        _write_stated(accepted)
    return outcomes


def _checked(stated: StatedValues, own: OwnAttributes) -> dict[str, Any] | None:
    """The values as checked, or None if the client states them already; a refusal
    is audited and raised."""
    with audit.refusals_recorded(
        actor=stated.actor,
        action="attributes.state",
        target=f"client:{stated.client.name}",
        details={"attempted": printable(stated.values)},
    ):
        checked = check_values(own.types, stated.values)
        _refuse_reserved(own, checked)
    # An agent states its whole model at every login: the same values again change
    # nothing, so nothing is written (no history, audit entry or work for the tree),
    # which a fleet reconnecting at once would otherwise pay for each of its agents.
    return None if _stated_already(own, checked) else checked


def _write_stated(accepted: list[tuple[StatedValues, dict[str, Any]]]) -> None:
    """Write checked values, their audit entries and their clients' changes for the
    tree."""
    changes = [
        audit.Change(s.actor, "attributes.state", f"client:{s.client.name}", {"values": checked})
        for s, checked in accepted
    ]
    with transaction.atomic():
        write_stated_values({s.client.pk: checked for s, checked in accepted})
        audit.record_changes(changes)
        entry.clients_changed([s.client for s, _ in accepted])


def _stated_already(own: OwnAttributes, values: Mapping[str, Any]) -> bool:
    """Whether the client itself states exactly these values now."""
    return all(own.stated.get(name) == canonical_json(value) for name, value in values.items())


def _refuse_reserved(own: OwnAttributes, values: Mapping[str, Any]) -> None:
    reserved = sorted(set(values) - own.self_stated)
    if reserved:
        raise NotAuthorised(
            f"{', '.join(reserved)} may only be set by an authority, not stated by the client "
            "itself",
            field=reserved[0],
        )
