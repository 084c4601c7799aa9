"""Reads of the event service that several callers reuse (the HTTP API, the pages)."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import cache
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.db import connection
from django.db.models import Count, Exists, OuterRef, Q, QuerySet
from django.utils import timezone
from guardian.models import GroupObjectPermission, UserObjectPermission

from broker.credentials import key_digest
from broker.errors import InvalidInput
from broker.models import (
    AgentPresence,
    AttestationGrant,
    AttributeHistory,
    AttributeValue,
    Authority,
    Client,
    ClientModel,
    ClientToken,
    Delivery,
    Event,
    EventAttribute,
    ModelAttribute,
    PolicyVersion,
    ReceiverStream,
)
from broker.notify import Pushed
from broker.prepared import prepared_cursor
from broker.vocabulary import Vocabulary
from policies import Selector


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
    return _by_client(rows)


def _by_client(rows: QuerySet[AttributeValue]) -> dict[int, dict]:
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
    """`attested_attributes` as SQL selecting (name, value), for statements that read
    them in passing (publishing): its runs give %(client)s (an id) and %(now)s."""
    client, now = _PROBES
    sql, params = _attested_values(client, now=now).values("name", "value").query.sql_with_params()
    names = [_PROBES.get(param, f"attested_{index}") for index, param in enumerate(params)]
    if sorted(set(_PROBES.values()) & set(names)) != ["client", "now"]:
        raise RuntimeError(f"attested_attributes compiles with parameters {params!r}")
    placeholders = iter(f"%({name})s" for name in names)
    constants = {n: p for n, p in zip(names, params, strict=True) if n not in _PROBES.values()}
    return CompiledQuery(re.sub("%s", lambda _: next(placeholders), sql), constants)


# ---------------------------------------------------------------------------
# Trust: authorities, the grants clients gave them and what they attested.


def authorities_overview() -> QuerySet[Authority]:
    """Every authority with `live_grants` (how many clients' grants stand) and its
    capabilities (with their models) fetched: the trust page's list, in three queries."""
    live = Count("grants", filter=Q(grants__revoked_at__isnull=True))
    return (
        Authority.objects.annotate(live_grants=live)
        .prefetch_related("capabilities__model")
        .order_by("name")
    )


def clients_granting(authority: Authority) -> QuerySet[Client]:
    """The clients whose grant to `authority` stands: their consent to its attestations."""
    granted = AttestationGrant.objects.filter(
        client_id=OuterRef("pk"), authority=authority, revoked_at__isnull=True
    )
    return Client.objects.filter(Exists(granted))


def granted_client_ids(
    authority: Authority, client_ids: Iterable[int], *, lock: bool = False
) -> set[int]:
    """Which of `client_ids` have a grant to `authority` that stands. With `lock`, the
    grants stay as read until commit (revoking one waits), for writes that rely on them."""
    grants = AttestationGrant.objects.filter(
        authority=authority, revoked_at__isnull=True, client_id__in=list(client_ids)
    )
    if lock:
        grants = grants.select_for_update(no_key=True)
    return set(grants.values_list("client_id", flat=True))


def capabilities_by_model(authority: Authority) -> dict[int, set[str]]:
    """{model id: names of that model's attributes `authority` may attest}."""
    found = defaultdict(set)
    for model_id, name in authority.capabilities.values_list("model_id", "name"):
        found[model_id].add(name)
    return found


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


def values_attested_by(
    authority: Authority, client_ids: Iterable[int], names: Iterable[str] | None = None
) -> dict[int, dict]:
    """{client id: {name: (value, expires_at)}} of the values `authority` attested on
    the clients and has not revoked (expired ones included: they can be renewed), of
    `names` only if given."""
    rows = AttributeValue.objects.filter(
        authority=authority, revoked_at__isnull=True, client_id__in=list(client_ids)
    )
    if names is not None:
        rows = rows.filter(name__in=list(names))
    return _by_client(rows)


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


def published_facts(event: Event) -> dict:
    """What publishing an event answers: its id, place in its channel and lifetime."""
    return {
        "event": event.pk,
        "channel": event.channel,
        "sequence": event.sequence,
        "published_at": event.published_at,
        "expires_at": event.expires_at,
    }


def event_status(event: Event) -> dict:
    """An event (its sender loaded with it) and what became of it at each receiver,
    receivers by name, with counts per state: one query for every delivery."""
    deliveries = list(
        Delivery.objects.filter(event=event)
        .order_by("receiver__name")
        .values("receiver__name", *DELIVERY_STATUS_FIELDS)
    )
    counts = dict.fromkeys(Delivery.State.values, 0)
    for delivery in deliveries:
        counts[delivery["state"]] += 1
    return {
        **published_facts(event),
        "sender": event.sender.name,
        "content": event.content,
        "selector": event.selector,
        "counts": counts,
        "deliveries": [_delivery_status(row) for row in deliveries],
    }


def _delivery_status(row: dict) -> dict:
    return {"receiver": row["receiver__name"], **{f: row[f] for f in DELIVERY_STATUS_FIELDS}}


DELIVERY_STATUS_FIELDS = ("position", "state", "delivered_at", "received_at", "acked_at", "result")


def current_policy(client: Client) -> PolicyVersion | None:
    """The client's newest policy version, or None if it never set one."""
    return client.policy_versions.order_by("-version").first()


def deliveries_to_replay(
    client: Client,
    *,
    after_position: int,
    through: int,
    unanswered_only: bool,
    limit: int,
) -> list[dict]:
    """The client's deliveries of unexpired events at positions after `after_position`
    up to `through`, in position order (its leaf commits them in that order, so channel
    order holds in every stream); only those it has not answered if `unanswered_only`."""
    query = Delivery.objects.filter(
        receiver=client,
        position__gt=after_position,
        position__lte=through,
        event__expires_at__gt=timezone.now(),
    )
    if unanswered_only:
        query = query.filter(state__in=UNANSWERED)
    rows = query.order_by("position").values(*REPLAY_FIELDS)[:limit]
    return [_notification(client, row) for row in rows]


UNANSWERED = (Delivery.State.PENDING, Delivery.State.DELIVERED)
REPLAY_FIELDS = ("pk", "position", "event_id", "sender_id", "channel", "sequence", "event__content")


def _notification(client: Client, row: dict) -> dict:
    return Pushed(
        delivery_id=row["pk"],
        position=row["position"],
        receiver_id=client.pk,
        event_id=str(row["event_id"]),
        sender_id=row["sender_id"],
        channel=row["channel"],
        sequence=row["sequence"],
        content=row["event__content"],
    ).as_message()


def stream_of(client: Client) -> ReceiverStream:
    """The client's delivery stream (positions 0/0 if it never had a delivery)."""
    return ReceiverStream.objects.filter(client=client).first() or ReceiverStream(client=client)


def last_position_of(client: Client) -> int:
    """The last position of the client's stream (0 if it never had a delivery). Read
    at every login, without the ORM's cost of compiling the query."""
    with prepared_cursor() as cursor:
        cursor.execute(LAST_POSITION, [client.pk])
        row = cursor.fetchone()
    return row[0] if row else 0


LAST_POSITION = f"SELECT last_position FROM {ReceiverStream._meta.db_table} WHERE client_id = %s"


def position_after_delivery(client: Client, delivery_id: int) -> int:
    """The position of the client's last delivery with an id up to `delivery_id`
    (agents of the protocol's first revision resume by delivery id), 0 if none."""
    found = Delivery.objects.filter(receiver=client, pk__lte=delivery_id).order_by("-pk")
    return next(iter(found.values_list("position", flat=True)[:1]), 0)


def preview_receivers(*, sender: Client, content: dict, selector: Selector | None) -> list[str]:
    """Names of the receivers an event would reach if published now: the selector
    selects their attributes and their policy accepts the sender's attested attributes
    and the content. Reads every receiver once; for previews, not for routing."""
    sender_attributes = attested_attributes(sender)
    policies = _current_policy_texts()
    words = vocabulary()
    values = attributes_by_client()
    receivers = Client.objects.filter(can_receive=True, is_active=True, pk__in=list(policies))
    return sorted(
        client.name
        for client in receivers.only("pk", "name")
        if (selector is None or selector.selects(values[client.pk]))
        and words.stored_policy(policies[client.pk]).accepts(sender_attributes, content)
    )


def _current_policy_texts() -> dict[int, str]:
    """{client id: text of its newest policy version}."""
    return newest_policies(field="text")


def newest_policies(
    client_ids: Iterable[int] | None = None, *, field: str = "canonical_text"
) -> dict[int, str]:
    """{client id: `field` of its newest policy version} for the clients given (or every
    client) that have one, in one query."""
    newest = PolicyVersion.objects.order_by("client_id", "-version").distinct("client_id")
    if client_ids is not None:
        newest = newest.filter(client_id__in=list(client_ids))
    return dict(newest.values_list("client_id", field))


# ---------------------------------------------------------------------------
# The vocabulary: one type per attribute name (docs/addressing.md).


def receiver_vocabulary() -> dict[str, str]:
    """{name: type} declared by the models of clients that can receive (active or
    not: clients are never deleted, so the vocabulary only grows)."""
    return _role_vocabulary(can_receive=True)


def sender_vocabulary() -> dict[str, str]:
    """{name: type} declared by the models of clients that can send."""
    return _role_vocabulary(can_send=True)


def event_vocabulary() -> dict[str, str]:
    """{name: type} of the declared event attributes."""
    return dict(EventAttribute.objects.values_list("name", "type"))


def _role_vocabulary(**role: bool) -> dict[str, str]:
    used = Client.objects.filter(model_id=OuterRef("model_id"), **role)
    rows = ModelAttribute.objects.filter(Exists(used)).order_by().values_list("name", "type")
    return dict(rows.distinct())


def model_vocabulary() -> dict[str, str]:
    """{name: type} declared by any model: what the fleet is searched by (controllers'
    attributes too, though no event addresses them)."""
    return dict(ModelAttribute.objects.order_by().values_list("name", "type").distinct())


_known: dict[str, tuple[tuple, Vocabulary]] = {}


def vocabulary() -> Vocabulary:
    """The current vocabulary, cached per process and read again when a model
    attribute, an event attribute or a client was added or removed since (one short
    query tells). The same content keeps the same object, and so its parse caches."""
    return stamped_vocabulary()[1]


def stamped_vocabulary(*, ask: bool = True) -> tuple[tuple, Vocabulary]:
    """`vocabulary()` with the stamp it was read at. With ask=False, as last read,
    without asking whether it changed since (read now if it never was): for a writer
    that checks the stamp in its own statement (`VOCABULARY_STAMP`) and asks again if
    it moved."""
    known = _known.get("routing")
    if known is not None and not ask:
        return known
    return _current("routing", _routing_vocabulary)


def search_vocabulary() -> Vocabulary:
    """The vocabulary the fleet is searched with: selectors typed by every model."""
    build = lambda: Vocabulary(receiver=model_vocabulary(), sender={}, event={})  # noqa: E731
    return _current("search", build)[1]


def _routing_vocabulary() -> Vocabulary:
    return Vocabulary(
        receiver=receiver_vocabulary(), sender=sender_vocabulary(), event=event_vocabulary()
    )


def _current(kind: str, build) -> tuple[tuple, Vocabulary]:
    # The stamp is read first: what is built is at least as new as the stamp says.
    stamp = _vocabulary_stamp()
    known = _known.get(kind)
    if known is not None and known[0] == stamp:
        return known
    fresh = build()
    if known is not None and known[1] == fresh:
        fresh = known[1]
    _known[kind] = (stamp, fresh)
    return stamp, fresh


def _vocabulary_stamp() -> tuple:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {', '.join(VOCABULARY_STAMP)}")
        return cursor.fetchone()


def _stamp_parts() -> tuple[str, ...]:
    # Sequences never hand out an id twice, so a new row always moves a maximum; the
    # counts see removals. Clients are many and never deleted: their maximum suffices.
    tables = [ModelAttribute._meta.db_table, EventAttribute._meta.db_table]
    parts = []
    for table in tables:
        parts += [f"(SELECT count(*) FROM {table})", f"(SELECT max(id) FROM {table})"]
    return (*parts, f"(SELECT max(id) FROM {Client._meta.db_table})")


# What the vocabulary is read from: SQL expressions, each a number (NULL for none).
VOCABULARY_STAMP = _stamp_parts()


def live_tokens(token: str) -> QuerySet[ClientToken]:
    """The token's records that still let their client in (not revoked, client
    active): the one rule for logging in and for staying logged in."""
    return ClientToken.objects.filter(
        key_hash=key_digest(token), revoked_at__isnull=True, client__is_active=True
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


# ---------------------------------------------------------------------------
# A client as its page shows it.


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


# ---------------------------------------------------------------------------
# A client as it was at a past moment (the attribute history a trigger keeps).


@dataclass(frozen=True)
class Provenance:
    """A value a client held at some moment, and who set it when, until when."""

    value: Any
    source: str  # AttributeValue.Source
    authority: str | None  # the attesting authority's name
    set_at: datetime
    expires_at: datetime | None

    @property
    def attested(self) -> bool:
        return self.source == AttributeValue.Source.AUTHORITY


def attributes_as_of(client: Client, moment: datetime) -> dict[str, Provenance]:
    """{name: provenance} of the values the client held at `moment`: for each name the
    last change at or before it, unless that was a revocation or the value had
    expired by then. One query (the history's index serves it)."""
    newest = (
        AttributeHistory.objects.filter(client=client, at__lte=moment)
        .order_by("name", "-at", "-id")
        .distinct("name")
        .select_related("authority")
    )
    return {
        row.name: _provenance(row)
        for row in newest
        if row.kind != AttributeHistory.Kind.REVOKED
        and (row.expires_at is None or row.expires_at > moment)
    }


def _provenance(row: AttributeHistory) -> Provenance:
    authority = row.authority.name if row.authority_id else None
    return Provenance(row.value, row.source, authority, row.set_at, row.expires_at)


def policy_as_of(client: Client, moment: datetime) -> PolicyVersion | None:
    """The client's policy in force at `moment`: its newest version saved at or
    before it (None: it had none, and so accepted nothing)."""
    versions = client.policy_versions.filter(created_at__lte=moment)
    return versions.order_by("-version").first()


def policy_history(client: Client) -> list[PolicyVersion]:
    """The client's policy versions, newest first."""
    return list(client.policy_versions.order_by("-version"))


def recent_deliveries(client: Client, *, limit: int = 50) -> list[Delivery]:
    """The client's newest deliveries with their events and senders."""
    query = Delivery.objects.filter(receiver=client).select_related("event", "sender")
    return list(query.order_by("-position")[:limit])


def event_with_sender(event_id) -> Event | None:
    """The event of that id with its sender, or None."""
    return Event.objects.select_related("sender").filter(pk=event_id).first()


def delivery_states(client: Client, events: Iterable[Event]) -> dict:
    """{event id: state of its delivery to `client`} for those of `events` it got."""
    rows = Delivery.objects.filter(receiver=client, event__in=[e.pk for e in events])
    return dict(rows.values_list("event_id", "state"))


# Agents' presence (broker.services.presence writes it).

# Sessions a killed web process left open are never closed; a session that is really
# open is seen at least every PRESENCE_REFRESH_S (and a heartbeat), so rows not seen
# for this many refreshes do not count as connected.
CONNECTED_WITHIN_REFRESHES = 3


def presence_window() -> timedelta:
    """How recently a client must have been seen to count as connected."""
    return CONNECTED_WITHIN_REFRESHES * timedelta(seconds=settings.PRESENCE_REFRESH_S)


def is_connected(presence: AgentPresence | None, now: datetime) -> bool:
    """The one rule for "connected": an open session, seen within the window."""
    return (
        presence is not None
        and presence.sessions > 0
        and presence.last_seen_at > now - presence_window()
    )


def connected_q(now: datetime, *, via: str = "") -> Q:
    """`is_connected` as a filter: on AgentPresence, or through a relation (`via`
    "presence__" on Client; a client without a row is not connected)."""
    return Q(**{f"{via}sessions__gt": 0, f"{via}last_seen_at__gt": now - presence_window()})


def presence_of(client: Client) -> AgentPresence | None:
    """The client's presence row, None if its agent never logged in."""
    return AgentPresence.objects.filter(client=client).first()


def presence_changed_since(moment: datetime) -> list[AgentPresence]:
    """Rows written at or after `moment`, oldest first. A write's time is its
    transaction's start, so an incremental reader should ask again from a little
    before the newest time it saw (rows read twice are harmless)."""
    return list(AgentPresence.objects.filter(updated_at__gte=moment).order_by("updated_at"))


# The facets of "last seen", in order: each holds ages up to its limit (and above the
# previous one); then older, then no row at all.
LAST_SEEN_WITHIN = {
    "within 1 minute": timedelta(minutes=1),
    "within 1 hour": timedelta(hours=1),
    "within 1 day": timedelta(days=1),
}
LAST_SEEN_OLDER = "over 1 day"
LAST_SEEN_NEVER = "never"
LAST_SEEN_BUCKETS = (*LAST_SEEN_WITHIN, LAST_SEEN_OLDER, LAST_SEEN_NEVER)


def last_seen_bucket(last_seen_at: datetime | None, now: datetime) -> str:
    """The label of the bucket `last_seen_at` falls in (None: never seen)."""
    if last_seen_at is None:
        return LAST_SEEN_NEVER
    age = now - last_seen_at
    return next((b for b, limit in LAST_SEEN_WITHIN.items() if age <= limit), LAST_SEEN_OLDER)


def last_seen_q(bucket: str, now: datetime, *, via: str = "") -> Q:
    """`last_seen_bucket(...) == bucket` as a filter, for counting facets in SQL
    (`via` as for `connected_q`)."""
    field = f"{via}last_seen_at"
    if bucket == LAST_SEEN_NEVER:
        return Q(**{f"{field}__isnull": True})
    older_than = Q()  # not in the previous bucket
    for label, limit in LAST_SEEN_WITHIN.items():
        if label == bucket:
            return Q(**{f"{field}__gte": now - limit}) & older_than
        older_than = Q(**{f"{field}__lt": now - limit})
    if bucket == LAST_SEEN_OLDER:
        return older_than
    raise InvalidInput(
        f"last seen must be one of: {', '.join(LAST_SEEN_BUCKETS)}", field="last_seen"
    )


# ---------------------------------------------------------------------------
# Sending as a sender client from the console (broker.services.sending).

SEND = "broker.add_event"  # the operator role's permission to send at all
SEND_AS = "broker.send_as_client"  # per sender client, or global for every sender

# The per-sender grants are django-guardian's rows, read and written by the permission's
# natural key: guardian's own shortcuts go through a per-process content type cache,
# which a long-lived web process may hold stale (a test database flushed under it).


def send_as_permission() -> Permission:
    """The permission row of sending as a sender client."""
    app_label, codename = SEND_AS.split(".", 1)
    return Permission.objects.select_related("content_type").get(
        content_type__app_label=app_label, codename=codename
    )


def granted_sender_ids(user) -> set[int]:
    """Ids of the senders `user` was granted, or one of their groups was."""
    permission = send_as_permission()
    mine = UserObjectPermission.objects.filter(user=user, permission=permission)
    ours = GroupObjectPermission.objects.filter(group__user=user, permission=permission)
    keys = [*mine.values_list("object_pk", flat=True), *ours.values_list("object_pk", flat=True)]
    return {int(key) for key in keys if key.isdigit()}


def senders_for(user) -> QuerySet[Client]:
    """The active sender clients `user` may send as: granted for each (to the user or
    one of their groups), or for every sender."""
    senders = Client.objects.filter(can_send=True, is_active=True).order_by("name")
    if not user.has_perm(SEND):
        return senders.none()
    if user.has_perm(SEND_AS):
        return senders
    return senders.filter(pk__in=granted_sender_ids(user))


def sending_holders(client: Client) -> list[str]:
    """Who may send as `client` by a grant for it: "group:NAME" and "user:NAME"."""
    rows = {"permission": send_as_permission(), "object_pk": str(client.pk)}
    groups = GroupObjectPermission.objects.filter(**rows).values_list("group__name", flat=True)
    users = UserObjectPermission.objects.filter(**rows).values_list("user__username", flat=True)
    return sorted([*(f"group:{name}" for name in groups), *(f"user:{name}" for name in users)])


MAX_SENDING_CANDIDATES = 500


def sending_candidates() -> list[str]:
    """Whom sending as a client can be granted to: every group (role), then users."""
    groups = Group.objects.order_by("name").values_list("name", flat=True)
    users = get_user_model().objects.filter(is_active=True).order_by("username")
    usernames = users.values_list("username", flat=True)[:MAX_SENDING_CANDIDATES]
    return [f"group:{name}" for name in groups] + [f"user:{name}" for name in usernames]


def sending_holder(text: str):
    """The group or user "group:NAME" / "user:NAME" names (as sending_holders and
    sending_candidates write them), or None."""
    kind, _, name = text.partition(":")
    if kind == "group":
        return Group.objects.filter(name=name).first()
    if kind == "user":
        return get_user_model().objects.filter(username=name, is_active=True).first()
    return None
