"""Operators sending as a sender client from the console: who may act for which
sender (an object permission per sender client, django-guardian), the confirmation a
large send needs, resending to the receivers that did not answer, and the ready-made
sends the Send page offers.

The sender's qualifying attributes stay the ones its authorities attested: acting for a
sender never lets an operator choose them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser, Group
from django.db import transaction
from guardian.models import GroupObjectPermission, UserObjectPermission

from broker import audit
from broker.audit import Actor
from broker.errors import BrokerError, InvalidInput, NotAuthorised
from broker.models import Client, Event, SendTemplate
from broker.reads.progress import UNANSWERED_STATES
from broker.reads.reach import Reach, reach_of
from broker.reads.sending import granted_sender_ids, send_as_permission
from broker.roles import SEND, SEND_AS
from broker.services.events import check_event, publish_event


class ConfirmationNeeded(BrokerError):
    """The send reaches more receivers than the threshold: the operator must type
    how many (`count`) to confirm."""

    code = "confirmation_needed"

    def __init__(self, message: str, *, count: int) -> None:
        super().__init__(message, field="confirm")
        self.count = count


@dataclass(frozen=True)
class Draft:
    """What an operator asks to send, as typed (checked by the event service)."""

    sender: Client
    content: dict[str, Any]
    selector: str = ""
    lifetime_s: Any = 60
    channel: Any = "default"
    recipients: list[int] | None = None
    resend_of: Event | None = None

    def event_fields(self) -> dict[str, Any]:
        """What the event service checks and publishes of it."""
        return {
            "sender": self.sender,
            "content": self.content,
            "selector": self.selector,
            "lifetime_s": self.lifetime_s,
            "channel": self.channel,
        }


def may_send_as(user: AbstractBaseUser, sender: Client) -> bool:
    """Whether `user` may send, and as this sender (granted for it, or for any)."""
    if not user.has_perm(SEND):
        return False
    return user.has_perm(SEND_AS) or sender.pk in granted_sender_ids(user)


def preview_send(*, user: AbstractBaseUser, draft: Draft) -> Reach:
    """Check the draft as publishing would and say whom it would reach; refusals
    (including acting for a sender one may not) are audited."""
    actor = Actor("user", user.get_username())
    _check_may_send(user, draft.sender, actor)
    selector = check_event(**draft.event_fields(), actor=actor)
    return reach_of(
        sender=draft.sender, content=draft.content, selector=selector, within=draft.recipients
    )


def send_as(
    *, user: AbstractBaseUser, draft: Draft, confirmed_count: int | None, code_is_fresh: bool
) -> Event:
    """Publish the draft as its sender for `user`. If it would reach more receivers
    than SEND_CONFIRM_ABOVE, `confirmed_count` must be exactly that number (typed by
    the operator), else ConfirmationNeeded says the number to type; and the operator
    must have typed a code of their second factor lately (`code_is_fresh`), else
    FreshCodeNeeded."""
    actor = Actor("user", user.get_username())
    reach = preview_send(user=user, draft=draft)
    _check_confirmation(reach.accepting, confirmed_count, actor, draft.sender)
    _check_fresh_code(reach.accepting, code_is_fresh, actor, draft.sender)
    with transaction.atomic():
        event = publish_event(
            **draft.event_fields(),
            actor=actor,
            recipients=draft.recipients,
            resend_of=draft.resend_of,
            console_signs=True,
        )
        _record_send(actor, event, reach, confirmed_count)
    return event


def resend_unanswered(
    *, user: AbstractBaseUser, event: Event, confirmed_count: int | None, code_is_fresh: bool
):
    """Send `event` again, as a new event limited to the receivers that have not
    answered it (still pending, confirmed without an answer, or expired unconfirmed)."""
    waiting = list(
        event.deliveries.filter(state__in=UNANSWERED_STATES).values_list("receiver_id", flat=True)
    )
    if not waiting:
        raise InvalidInput("every receiver of this event answered", field="event")
    draft = Draft(
        sender=event.sender,
        content=event.content,
        selector=event.selector,
        lifetime_s=event.lifetime_s,
        channel=event.channel,
        recipients=sorted(waiting),
        resend_of=event,
    )
    return send_as(
        user=user, draft=draft, confirmed_count=confirmed_count, code_is_fresh=code_is_fresh
    )


def _check_may_send(user: AbstractBaseUser, sender: Client, actor: Actor) -> None:
    target = f"client:{sender.name}"
    with audit.refusals_recorded(actor=actor, action="event.send", target=target):
        if not may_send_as(user, sender):
            raise NotAuthorised(
                f"{user.get_username()} may not send as {sender.name}", field="sender"
            )


class FreshCodeNeeded(BrokerError):
    """The action needs a code of the operator's second factor typed lately."""

    code = "fresh_code_needed"


def _check_confirmation(count: int, confirmed: int | None, actor: Actor, sender: Client) -> None:
    """Let the send go if it is small or the operator typed its count (a negative
    `confirmed` stands for something typed that is not a number)."""
    if count <= settings.SEND_CONFIRM_ABOVE or confirmed == count:
        return
    message = f"this reaches {count} receivers: type {count} to confirm"
    if confirmed is None:
        raise ConfirmationNeeded(message, count=count)
    typed = "something else" if confirmed < 0 else str(confirmed)
    target = f"client:{sender.name}"
    with audit.refusals_recorded(actor=actor, action="event.send", target=target):
        raise ConfirmationNeeded(f"you typed {typed}, but {message}", count=count)


def _check_fresh_code(count: int, fresh: bool, actor: Actor, sender: Client) -> None:
    """A send above SEND_CONFIRM_ABOVE needs a second-factor code typed lately: a
    stolen session alone cannot make one."""
    if count <= settings.SEND_CONFIRM_ABOVE or fresh:
        return
    target = f"client:{sender.name}"
    with audit.refusals_recorded(actor=actor, action="event.send", target=target):
        raise FreshCodeNeeded(
            f"this reaches {count} receivers: type a fresh code of your second factor first"
        )


def _record_send(actor: Actor, event: Event, reach: Reach, confirmed: int | None) -> None:
    details = {
        "as": event.sender.name,
        "selector": event.selector,
        "addressed": reach.addressed,
        "accepting": reach.accepting,
        "refused_by": audit.listed(reach.refusing_names),
        "confirmed_by": actor.name if confirmed is not None else None,
        "confirmed_count": confirmed,
    }
    if event.resend_of_id:
        details["resend_of"] = str(event.resend_of_id)
    audit.record_change(
        actor=actor, action="event.send", target=f"event:{event.pk}", details=details
    )


def grant_sending(*, client: Client, holder: AbstractBaseUser | Group, actor: Actor) -> None:
    """Let a user or a group (a role) send as `client` from the console."""
    _check_sender(client)
    with transaction.atomic():
        _grants_of(holder).get_or_create(**_grant(holder, client))
        _record_grant(actor, "client.grant_sending", client, holder)


def withdraw_sending(*, client: Client, holder: AbstractBaseUser | Group, actor: Actor) -> None:
    """Stop a user or a group sending as `client` (a global grant is not touched)."""
    with transaction.atomic():
        _grants_of(holder).filter(**_grant(holder, client)).delete()
        _record_grant(actor, "client.withdraw_sending", client, holder)


def _grant(holder: AbstractBaseUser | Group, client: Client) -> dict:
    """The guardian row of `holder` sending as `client`, by the permission's natural key
    (see broker.reads.sending.send_as_permission)."""
    permission = send_as_permission()
    kind = "group" if isinstance(holder, Group) else "user"
    return {
        kind: holder,
        "permission": permission,
        "content_type": permission.content_type,
        "object_pk": str(client.pk),
    }


def _grants_of(holder: AbstractBaseUser | Group):
    model = GroupObjectPermission if isinstance(holder, Group) else UserObjectPermission
    return model.objects


def _record_grant(actor: Actor, action: str, client: Client, holder) -> None:
    audit.record_change(
        actor=actor,
        action=action,
        target=f"client:{client.name}",
        details={"holder": _holder_name(holder)},
    )


def _check_sender(client: Client) -> None:
    if not client.can_send:
        raise InvalidInput(f"{client.name} is not a sender", field="client")


def _holder_name(holder: AbstractBaseUser | Group) -> str:
    if isinstance(holder, Group):
        return f"group:{holder.name}"
    return f"user:{holder.get_username()}"


SLUG = re.compile(r"[a-z0-9]+(-[a-z0-9]+)*")
MAX_SLUG = 64
MAX_TITLE = 200


def save_send_template(*, slug: str, title: str, draft: Draft, actor: Actor) -> SendTemplate:
    """Offer `draft` ready-made on the Send page as `title` (`?template=SLUG`), or put
    it in place of the one of that slug. It is checked as publishing checks an event
    (a refusal audited, naming its field), so that what the page fills in can be sent,
    as its sender's attributes and receivers' policies stand. Audited."""
    target = f"send_template:{slug}"
    with audit.refusals_recorded(actor=actor, action="send_template.save", target=target):
        _check_template_names(slug, title)
    check_event(**draft.event_fields(), actor=actor)
    with transaction.atomic():
        fields = {"title": title, **draft.event_fields()}
        template, made = SendTemplate.objects.update_or_create(slug=slug, defaults=fields)
        details = {"title": title, "sender": draft.sender.name, "replaced": not made}
        audit.record_change(
            actor=actor, action="send_template.save", target=target, details=details
        )
    return template


def _check_template_names(slug: str, title: str) -> None:
    if not isinstance(slug, str) or len(slug) > MAX_SLUG or not SLUG.fullmatch(slug):
        raise InvalidInput(
            f"a template's slug is 1-{MAX_SLUG} lower-case letters and digits, in words "
            "joined by '-' (worm-alert)",
            field="slug",
        )
    if not isinstance(title, str) or not title.strip() or len(title) > MAX_TITLE:
        raise InvalidInput(f"a template's title is 1-{MAX_TITLE} characters", field="title")
