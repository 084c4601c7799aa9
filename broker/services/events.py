"""Publishing events: validated, numbered per channel, committed, then routed."""

from __future__ import annotations

import json
import math
import re
import uuid
from collections.abc import Mapping
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import timedelta
from functools import cache, partial
from typing import Any

from django.db import IntegrityError, connection, transaction
from django.utils import timezone
from psycopg.types.json import Jsonb

from broker import audit, seals
from broker.attributes import check_value
from broker.audit import Actor
from broker.dispatch.entry import route_published
from broker.errors import InvalidInput, NotAuthorised, PolicyRejected
from broker.models import Client, Event
from broker.prepared import prepared_cursor
from broker.push.to_consoles import EVENTS, announce
from broker.reads.clients import attested_attributes_sql
from broker.vocabulary import (
    VOCABULARY_STAMP,
    Vocabulary,
    refused_only_if_current,
    stamped_vocabulary,
    vocabulary,
)
from policies import PolicySyntaxError, Selector

MAX_LIFETIME_S = 7 * 24 * 3600
MAX_CONTENT_ATTRIBUTES = 100
# Every receiver is pushed the content: a command, not a payload (a file goes elsewhere).
MAX_CONTENT_BYTES = 64 * 1024
MAX_SELECTOR_LENGTH = 10_000
CONTENT_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
CHANNEL_NAME = re.compile(r"^[A-Za-z0-9_.:/-]{1,128}$")
IDEMPOTENCY_KEY = re.compile(r"^[\x21-\x7e]{1,128}$")
# Content names that would pose as the sender's attributes: refused, not ignored.
FORGED_NAMES = frozenset({"sender", "receiver", "event"})


def publish_event(
    *,
    sender: Client,
    content: Mapping[str, Any],
    selector: str = "",
    lifetime_s: int = 60,
    channel: str = "default",
    idempotency_key: str | None = None,
    actor: Actor | None = None,
    recipients: list[int] | None = None,
    resend_of: Event | None = None,
    signed: SenderSignature | None = None,
    console_signs: bool = False,
) -> Event:
    """Accept an event from `sender` and route it after commit.

    The sender's qualifying attributes are the ones authorities attested, read now and
    stored with the event; nothing in `content` can change them. With an
    `idempotency_key` the sender already used, nothing is published: the event first
    published with it is returned (a retry after a lost answer must not send twice).
    `recipients` limits who may receive it to those clients (a resend to the receivers
    that did not answer `resend_of`).

    An event is signed (broker.seals) by its sender (`signed`: the id, time and
    signature the sender chose, checked here), or by the console for an operator's
    send if it holds the sender's key (`console_signs`); else it goes unsigned, and
    agents that verify refuse it.
    """
    actor = actor or Actor("client", sender.name)
    audited = partial(
        audit.refusals_recorded,
        actor=actor,
        action="event.publish",
        target=f"client:{sender.name}",
        details={"channel": str(channel)[:128]},
    )
    origin = Origin(str(actor), recipients, resend_of)
    check = partial(_check_publish, sender, content, selector, lifetime_s, channel)
    stamp, words = stamped_vocabulary(ask=False)
    attempt = 1
    while True:
        with audited():
            # Refused only under the current vocabulary: this process may have read
            # its own before another declared a name the event uses (a bulk load).
            _, stamp, words = refused_only_if_current(check, stamp, words)
            key = _checked_key(idempotency_key)
            request = PublishRequest(dict(content), selector.strip(), lifetime_s, channel)
            earlier = _earlier_event(sender, key, request)
            if earlier is None:
                sealed = _sealed(sender, request, signed, console_signs)
        if earlier is not None:
            return earlier
        # The last attempt is checked against the vocabulary read just before it, without
        # the statement comparing stamps: a vocabulary that keeps moving (models or event
        # attributes declared all the time) must not stop publishing.
        checked = stamp if attempt < VOCABULARY_ATTEMPTS else None
        event = _publish_or_earlier(sender, request, key, origin, checked, audited, sealed)
        if event is not None:
            return event
        # Declarations changed since `words` was read: check the event again.
        stamp, words = stamped_vocabulary()
        attempt += 1


def _publish_or_earlier(sender, request, key, origin, stamp, audited, sealed) -> Event | None:
    try:
        return _publish(sender, request, key, origin, stamp, sealed)
    except IntegrityError:
        # Another publish with the same key committed in between: it wins.
        with audited():
            earlier = _earlier_event(sender, key, request)
            if earlier is None and Event.objects.filter(pk=sealed.event_id).exists():
                raise _id_taken(sealed.event_id) from None
        if earlier is None:
            raise
        return earlier


@dataclass(frozen=True)
class SenderSignature:
    """What a sender that signs its events sends with one (sn_agent.signatures)."""

    event_id: Any
    signed_at: Any
    signature: Any


def sender_signature(*, event_id: Any, signed_at: Any, signature: Any) -> SenderSignature | None:
    """What a publish brings of its sender's signature (None: nothing); checked, and a
    refusal audited, as the event is (`_sealed`)."""
    if event_id is None and signed_at is None and signature is None:
        return None
    return SenderSignature(event_id, signed_at, signature)


def _check_all_given(signed: SenderSignature) -> None:
    given = {"id": signed.event_id, "signed_at": signed.signed_at, "signature": signed.signature}
    missing = [name for name, value in given.items() if value is None]
    if missing:
        raise InvalidInput(
            f"a signed event gives id, signed_at and signature; {missing[0]} is missing",
            field=missing[0],
        )


@dataclass(frozen=True)
class Sealed:
    """The id an event gets, and its seal (None: not signed)."""

    event_id: str
    seal: dict | None


def _sealed(
    sender: Client, request: PublishRequest, signed: SenderSignature | None, console_signs: bool
) -> Sealed:
    if signed is None:
        event_id = str(uuid.uuid4())
        if not console_signs:
            return Sealed(event_id, None)
        now = timezone.now()
        seal = seals.console_seal(event_id=event_id, sender=sender, request=request, now=now)
        return Sealed(event_id, seal)
    _check_all_given(signed)
    event_id = _checked_event_id(signed.event_id)
    seal = seals.sender_seal(
        event_id=event_id,
        sender=sender,
        request=request,
        signed_at=signed.signed_at,
        signature=signed.signature,
    )
    return Sealed(event_id, seal)


def _checked_event_id(event_id: Any) -> str:
    """A signed event's id, chosen by its sender: a UUID (one used before is refused
    when the insert finds it taken, `_publish_or_earlier`)."""
    try:
        return str(uuid.UUID(str(event_id)))
    except ValueError:
        raise InvalidInput("id is the event's UUID, chosen by the sender", field="id") from None


def _id_taken(event_id: str) -> InvalidInput:
    return InvalidInput(f"an event with id {event_id} was published already", field="id")


@dataclass(frozen=True)
class PublishRequest:
    """What a sender asked to publish, as compared between retries."""

    content: dict
    selector: str
    lifetime_s: int
    channel: str


@dataclass(frozen=True)
class Origin:
    """Who published an event, and whom it is limited to (a resend's receivers)."""

    sent_by: str
    recipients: list[int] | None = None
    resend_of: Event | None = None


def _publish(
    sender: Client,
    request: PublishRequest,
    key: str,
    origin: Origin,
    stamp: tuple | None,
    sealed: Sealed,
) -> Event | None:
    """Insert and route the event; None if the vocabulary moved from `stamp` (None:
    not compared)."""
    # Inside a caller's transaction, a savepoint: a failure (a repeated key) must leave
    # that transaction usable. Alone, the one statement is its own transaction.
    with transaction.atomic() if connection.in_atomic_block else nullcontext():
        event = _insert_event(sender, request, key, origin, stamp, sealed)
        if event is None:
            return None
        # The first hop is sent once the event commits; should it be lost, the sweep
        # sends it again: an accepted event is never left without its routing.
        route_published(event)
        transaction.on_commit(lambda: announce([EVENTS]), robust=True)
    return event


def _checked_key(key: Any) -> str:
    """The idempotency key, "" for none."""
    if key is None:
        return ""
    if not isinstance(key, str) or not IDEMPOTENCY_KEY.fullmatch(key):
        raise InvalidInput(
            "idempotency_key must be 1-128 printable characters without spaces",
            field="idempotency_key",
        )
    return key


def _earlier_event(sender: Client, key: str, request: PublishRequest) -> Event | None:
    """The event the sender published with `key` before, if any; refused if the key
    was used for a different request (a client bug that must not go unnoticed)."""
    if not key:
        return None
    earlier = Event.objects.filter(sender=sender, idempotency_key=key).first()
    if earlier is not None and _request_of(earlier) != request:
        raise InvalidInput(
            f"idempotency_key {key!r} was used for a different event ({earlier.pk})",
            field="idempotency_key",
        )
    return earlier


def _request_of(event: Event) -> PublishRequest:
    return PublishRequest(event.content, event.selector, event.lifetime_s, event.channel)


def check_event(
    *,
    sender: Client,
    content: Mapping[str, Any],
    selector: str = "",
    lifetime_s: Any = 60,
    channel: Any = "default",
    actor: Actor | None = None,
) -> Selector | None:
    """Check an event as publishing would, without publishing it (a preview); return
    its parsed selector. Refusals are audited."""
    actor = actor or Actor("client", sender.name)
    target = f"client:{sender.name}"
    with audit.refusals_recorded(actor=actor, action="event.preview", target=target):
        return _check_publish(sender, content, selector, lifetime_s, channel, vocabulary())


def _check_publish(
    sender: Client, content: Any, selector: str, lifetime_s: Any, channel: Any, words: Vocabulary
) -> Selector | None:
    """Refuse what may not be published; return the selector typed by `words`."""
    if not sender.can_send:
        raise NotAuthorised(f"{sender.name} is not allowed to send", field="sender")
    _check_content(content)
    _check_declared_content(content, words)
    if isinstance(lifetime_s, bool) or not isinstance(lifetime_s, int):
        raise InvalidInput("lifetime_s must be a whole number of seconds", field="lifetime_s")
    if not 1 <= lifetime_s <= MAX_LIFETIME_S:
        raise InvalidInput(f"lifetime_s must be 1 to {MAX_LIFETIME_S}", field="lifetime_s")
    if not isinstance(channel, str) or not CHANNEL_NAME.fullmatch(channel):
        raise InvalidInput("channel must be 1-128 letters, digits or _ . : / -", field="channel")
    return _check_selector(selector, words)


def _check_content(content: Any) -> None:
    if not isinstance(content, Mapping) or not content:
        raise InvalidInput("content must be a non-empty object of attributes", field="content")
    if len(content) > MAX_CONTENT_ATTRIBUTES:
        raise InvalidInput(
            f"content has more than {MAX_CONTENT_ATTRIBUTES} attributes", field="content"
        )
    if len(json.dumps(content, default=str)) > MAX_CONTENT_BYTES:
        raise InvalidInput(
            f"content is larger than {MAX_CONTENT_BYTES} bytes as JSON", field="content"
        )
    for name, value in content.items():
        if not isinstance(name, str) or not CONTENT_NAME.fullmatch(name.split(".", 1)[-1]):
            raise InvalidInput(f"{name!r} is not a valid attribute name", field=f"content.{name}")
        if "." in name or name in FORGED_NAMES:
            raise NotAuthorised(
                f"content may not carry {name!r}: the sender's attributes come from its "
                "attestations, never from the event",
                field=f"content.{name}",
            )
        if not isinstance(value, str | int | float | bool) or _not_finite(value):
            raise InvalidInput(
                f"{name} must be text, a number or true/false", field=f"content.{name}"
            )


def _not_finite(value: Any) -> bool:
    # NaN and infinities are not JSON: PostgreSQL would refuse to store them.
    return isinstance(value, float) and not math.isfinite(value)


def _check_declared_content(content: Mapping[str, Any], words: Vocabulary) -> None:
    """A declared event attribute's value must fit its type, or no policy could test
    it as declared. Undeclared names pass: content-only pub/sub needs no declaration,
    but no policy can test them (docs/addressing.md)."""
    for name, value in content.items():
        declared = words.event.get(name)
        if declared is not None:
            label = f"event attribute {name} ({declared})"
            check_value(label, declared, value, field=f"content.{name}")


def _check_selector(selector: Any, words: Vocabulary) -> Selector | None:
    if not isinstance(selector, str):
        raise InvalidInput("selector must be text", field="selector")
    if len(selector) > MAX_SELECTOR_LENGTH:
        raise InvalidInput(f"selector is longer than {MAX_SELECTOR_LENGTH}", field="selector")
    if not selector.strip():
        return None
    try:
        # Typed by the receivers' models, as the leaves will type it; the text as
        # sent, so that positions are the sender's. Cached: senders repeat selectors.
        return words.selector(selector)
    except PolicySyntaxError as error:
        raise PolicyRejected(
            str(error), field="selector", line=error.line, column=error.column
        ) from None


# Publishing is one statement: it checks that the vocabulary the event was checked
# with is still the current one, numbers the event in its channel, reads the sender's
# attested attributes and inserts the event. Run on its own it needs no transaction
# (no BEGIN, no COMMIT), and the channel's cursor row stays locked until it commits, so
# sequence n commits before n+1 is handed out.
PUBLISH = """
WITH unchanged AS (
    SELECT WHERE NOT %(check)s::boolean OR ROW({stamp}) IS NOT DISTINCT FROM ROW({expected})
), numbered AS (
    INSERT INTO broker_channelcursor (sender_id, channel, last_sequence)
    SELECT %(sender)s::bigint, %(channel)s::text, 1 FROM unchanged
    ON CONFLICT (sender_id, channel)
    DO UPDATE SET last_sequence = broker_channelcursor.last_sequence + 1
    RETURNING last_sequence
), attested AS (
    SELECT coalesce(jsonb_object_agg(live.name, live.value), '{{}}') AS attributes,
        coalesce(jsonb_agg(live.seal) FILTER (WHERE live.seal IS NOT NULL), '[]')
            AS attestations
    FROM ({attested}) AS live
)
INSERT INTO broker_event (
    id, sender_id, channel, sequence, content, selector, sender_attributes, lifetime_s,
    published_at, expires_at, idempotency_key, sent_by, resend_of_id, recipients, seal
)
SELECT %(id)s::uuid, %(sender)s::bigint, %(channel)s::text, numbered.last_sequence,
    %(content)s::jsonb, %(selector)s::text, attested.attributes, %(lifetime_s)s::integer,
    %(published_at)s::timestamptz, %(expires_at)s::timestamptz, %(idempotency_key)s::text,
    %(sent_by)s::text, %(resend_of)s::uuid, %(recipients)s::bigint[],
    %(seal)s::jsonb || jsonb_build_object('attestations', attested.attestations)
FROM numbered, attested
RETURNING sequence, sender_attributes, seal, txid
"""
# How many times an event is checked again because the vocabulary moved meanwhile.
VOCABULARY_ATTEMPTS = 5


@cache
def _publish_sql() -> str:
    expected = ", ".join(f"%(s{index})s::bigint" for index in range(len(VOCABULARY_STAMP)))
    stamp = ", ".join(VOCABULARY_STAMP)
    return PUBLISH.format(stamp=stamp, expected=expected, attested=attested_attributes_sql().sql)


def _insert_event(
    sender: Client,
    request: PublishRequest,
    key: str,
    origin: Origin,
    stamp: tuple | None,
    sealed: Sealed,
) -> Event | None:
    """Insert the event in one statement; None if the vocabulary moved from `stamp`."""
    now = timezone.now()
    event = Event(
        id=uuid.UUID(sealed.event_id),
        seal=sealed.seal,
        sender=sender,
        channel=request.channel,
        content=request.content,
        selector=request.selector,
        lifetime_s=request.lifetime_s,
        published_at=now,
        expires_at=now + timedelta(seconds=request.lifetime_s),
        idempotency_key=key,
        sent_by=origin.sent_by,
        recipients=origin.recipients,
        resend_of=origin.resend_of,
    )
    attested = {**attested_attributes_sql().constants, "client": sender.pk, "now": now}
    with prepared_cursor() as cursor:
        cursor.execute(_publish_sql(), {**_publish_params(event, stamp), **attested})
        row = cursor.fetchone()
    if row is None:
        return None
    event.sequence, attributes, seal, event.txid = row
    event.sender_attributes = json.loads(attributes)  # Django reads jsonb as text
    event.seal = None if seal is None else json.loads(seal)
    event._state.adding, event._state.db = False, connection.alias
    return event


def _publish_params(event: Event, stamp: tuple | None) -> dict[str, Any]:
    return {
        "check": stamp is not None,
        **{
            f"s{index}": value
            for index, value in enumerate(stamp or (None,) * len(VOCABULARY_STAMP))
        },
        "id": event.id,
        "sender": event.sender_id,
        "channel": event.channel,
        "content": Jsonb(event.content),
        "selector": event.selector,
        "lifetime_s": event.lifetime_s,
        "published_at": event.published_at,
        "expires_at": event.expires_at,
        "idempotency_key": event.idempotency_key,
        "sent_by": event.sent_by,
        "resend_of": event.resend_of_id,
        "recipients": event.recipients,
        "seal": None if event.seal is None else Jsonb(event.seal),
    }
