"""Publishing events: validated, numbered per channel, committed, then routed."""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from broker import audit
from broker.audit import Actor
from broker.dispatch.events import parsed_selector
from broker.errors import InvalidInput, NotAuthorised, PolicyRejected
from broker.models import Client, Event
from broker.routing import route_published
from broker.selectors import attested_attributes
from policies import PolicySyntaxError, Selector

MAX_LIFETIME_S = 7 * 24 * 3600
MAX_CONTENT_ATTRIBUTES = 100
MAX_SELECTOR_LENGTH = 10_000
CONTENT_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
CHANNEL_NAME = re.compile(r"^[A-Za-z0-9_.:/-]{1,128}$")
# Content names that would pose as the sender's attributes: refused, not ignored.
FORGED_NAMES = frozenset({"sender", "receiver", "event"})


def publish_event(
    *,
    sender: Client,
    content: Mapping[str, Any],
    selector: str = "",
    lifetime_s: int = 60,
    channel: str = "default",
    actor: Actor | None = None,
) -> Event:
    """Accept an event from `sender` and route it after commit.

    The sender's qualifying attributes are the ones authorities attested, read now and
    stored with the event; nothing in `content` can change them.
    """
    actor = actor or Actor("client", sender.name)
    with audit.refusals_recorded(
        actor=actor,
        action="event.publish",
        target=f"client:{sender.name}",
        details={"channel": str(channel)[:128]},
    ):
        _check_publish(sender, content, selector, lifetime_s, channel)
    with transaction.atomic():
        event = _create_event(sender, dict(content), selector.strip(), lifetime_s, channel)
        # The first hop is written with the event: an accepted event is never left
        # without its routing.
        route_published(event)
    return event


def check_event(
    *, sender: Client, content: Mapping[str, Any], selector: str = ""
) -> Selector | None:
    """Check an event as publishing would, without publishing it (a preview); return
    its parsed selector. Refusals are audited."""
    actor = Actor("client", sender.name)
    target = f"client:{sender.name}"
    with audit.refusals_recorded(actor=actor, action="event.preview", target=target):
        _check_publish(sender, content, selector, 60, "default")
    return parsed_selector(selector.strip())


def _check_publish(
    sender: Client, content: Any, selector: str, lifetime_s: Any, channel: Any
) -> None:
    if not sender.can_send:
        raise NotAuthorised(f"{sender.name} is not allowed to send", field="sender")
    _check_content(content)
    if isinstance(lifetime_s, bool) or not isinstance(lifetime_s, int):
        raise InvalidInput("lifetime_s must be a whole number of seconds", field="lifetime_s")
    if not 1 <= lifetime_s <= MAX_LIFETIME_S:
        raise InvalidInput(f"lifetime_s must be 1 to {MAX_LIFETIME_S}", field="lifetime_s")
    if not isinstance(channel, str) or not CHANNEL_NAME.fullmatch(channel):
        raise InvalidInput("channel must be 1-128 letters, digits or _ . : / -", field="channel")
    _check_selector(selector)


def _check_content(content: Any) -> None:
    if not isinstance(content, Mapping) or not content:
        raise InvalidInput("content must be a non-empty object of attributes", field="content")
    if len(content) > MAX_CONTENT_ATTRIBUTES:
        raise InvalidInput(
            f"content has more than {MAX_CONTENT_ATTRIBUTES} attributes", field="content"
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
        if not isinstance(value, str | int | float | bool):
            raise InvalidInput(
                f"{name} must be text, a number or true/false", field=f"content.{name}"
            )


def _check_selector(selector: Any) -> None:
    if not isinstance(selector, str):
        raise InvalidInput("selector must be text", field="selector")
    if len(selector) > MAX_SELECTOR_LENGTH:
        raise InvalidInput(f"selector is longer than {MAX_SELECTOR_LENGTH}", field="selector")
    if selector.strip():
        try:
            parsed_selector(selector)  # cached: senders repeat their selectors
        except PolicySyntaxError as error:
            raise PolicyRejected(
                str(error), field="selector", line=error.line, column=error.column
            ) from None


NEXT_SEQUENCE = """
INSERT INTO broker_channelcursor (sender_id, channel, last_sequence) VALUES (%s, %s, 1)
ON CONFLICT (sender_id, channel)
DO UPDATE SET last_sequence = broker_channelcursor.last_sequence + 1
RETURNING last_sequence
"""


def _next_sequence(sender: Client, channel: str) -> int:
    """Number the event in one statement. The cursor row stays locked until commit,
    so sequence n commits before n+1 is handed out."""
    with connection.cursor() as cursor:
        cursor.execute(NEXT_SEQUENCE, [sender.pk, channel])
        return cursor.fetchone()[0]


def _create_event(
    sender: Client, content: dict, selector: str, lifetime_s: int, channel: str
) -> Event:
    now = timezone.now()
    return Event.objects.create(
        sender=sender,
        channel=channel,
        sequence=_next_sequence(sender, channel),
        content=content,
        selector=selector,
        sender_attributes=attested_attributes(sender, now=now),
        lifetime_s=lifetime_s,
        published_at=now,
        expires_at=now + timedelta(seconds=lifetime_s),
    )
