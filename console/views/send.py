"""The Send page: compose an event as a sender client the operator may act for, see
whom it reaches and who would refuse it and why, confirm a large send, and send."""

from __future__ import annotations

import json

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST
from django_htmx.http import HttpResponseClientRedirect

from broker.errors import BrokerError, NotAuthorised
from broker.inputs import invisible_in
from broker.models import Event
from broker.reads.sending import send_templates, senders_for
from broker.roles import SEND
from broker.seals import console_signs_as
from broker.services.sending import (
    ConfirmationNeeded,
    FreshCodeNeeded,
    preview_send,
    resend_unanswered,
    send_as,
)
from broker.vocabulary import event_vocabulary
from console.access import fresh_code_form, has_fresh_code, requires
from console.drafts import draft_from

TEMPLATE = "console/send.html"
LIFETIMES = ((60, "1 minute"), (300, "5 minutes"), (600, "10 minutes"), (3600, "1 hour"))


@require_GET
@requires(SEND, action="event.compose")
def compose(request: HttpRequest) -> HttpResponse:
    """The send form, filled from a ready-made send (`?template=SLUG`, as saved by
    broker.services.sending.save_send_template) or a selector (`?selector=`)."""
    templates = send_templates()
    slug = request.GET.get("template", "")
    chosen = next((template for template in templates if template.slug == slug), None)
    context = {
        "senders": list(senders_for(request.user)),
        "templates": templates,
        "initial": _initial(request, chosen),
        "declared": sorted(event_vocabulary().items()),
        "lifetimes": LIFETIMES,
        "threshold": settings.SEND_CONFIRM_ABOVE,
    }
    return render(request, TEMPLATE, context)


def _initial(request: HttpRequest, chosen) -> dict:
    if chosen is not None:
        rows = [{"name": k, "value": _shown(v)} for k, v in chosen.content.items()]
        return {
            "sender": chosen.sender.name,
            "selector": chosen.selector,
            "lifetime_s": chosen.lifetime_s,
            "channel": chosen.channel,
            "rows": rows,
            "json": json.dumps(chosen.content, indent=2),
        }
    selector = request.GET.get("selector", "")
    return {"selector": selector, "lifetime_s": 60, "channel": "default", "rows": [], "json": ""}


def _shown(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


@require_POST
@requires(SEND, action="event.preview")
def preview(request: HttpRequest) -> HttpResponse:
    """Whom the draft would reach, and who would refuse it and why."""
    try:
        draft = draft_from(request.POST)
        reach = preview_send(user=request.user, draft=draft)
    except BrokerError as error:
        return render(request, f"{TEMPLATE}#preview", {"problem": error}, status=400)
    context = {
        "reach": reach,
        "threshold": settings.SEND_CONFIRM_ABOVE,
        "invisible": _invisible_in_draft(draft),
        "signing": console_signs_as(draft.sender),
    }
    return render(request, f"{TEMPLATE}#preview", context)


def _invisible_in_draft(draft) -> list[tuple[str, list[str]]]:
    """Where the draft hides characters that would make it read differently than it
    acts (a right-to-left override in the content, a zero-width space in a selector)."""
    fields = {"content": draft.content, "selector": draft.selector, "channel": draft.channel}
    return [hit for name, value in fields.items() for hit in invisible_in(value, name)]


@require_POST
@requires(SEND, action="event.send")
def send(request: HttpRequest) -> HttpResponse:
    """Send the draft; a large send first asks for its count to be typed."""
    try:
        draft = draft_from(request.POST)
        event = send_as(
            user=request.user,
            draft=draft,
            confirmed_count=_typed_count(request),
            code_is_fresh=has_fresh_code(request),
        )
    except ConfirmationNeeded as needed:
        return render(request, f"{TEMPLATE}#confirm", {"needed": needed}, status=409)
    except FreshCodeNeeded:
        return fresh_code_form(request)
    except BrokerError as error:
        return _problem(request, error)
    return _to_event(request, event)


@require_POST
@requires(SEND, action="event.resend")
def resend(request: HttpRequest, event_id) -> HttpResponse:
    """Send the event again to exactly the receivers that have not answered it."""
    event = get_object_or_404(Event.objects.select_related("sender"), pk=event_id)
    try:
        again = resend_unanswered(
            user=request.user,
            event=event,
            confirmed_count=_typed_count(request),
            code_is_fresh=has_fresh_code(request),
        )
    except ConfirmationNeeded as needed:
        context = {"needed": needed, "action": reverse("event-resend", args=[event.pk])}
        return render(request, f"{TEMPLATE}#confirm", context, status=409)
    except FreshCodeNeeded:
        return fresh_code_form(request)
    except BrokerError as error:
        return _problem(request, error)
    return _to_event(request, again)


def _problem(request: HttpRequest, error: BrokerError) -> HttpResponse:
    status = 403 if isinstance(error, NotAuthorised) else 400
    return render(request, f"{TEMPLATE}#sent", {"problem": error}, status=status)


def _typed_count(request: HttpRequest) -> int | None:
    """The count the operator typed to confirm (None: none typed; -1: not a number)."""
    typed = request.POST.get("confirm_count", "").strip().replace(",", "")
    if not typed:
        return None
    return int(typed) if typed.isdigit() and len(typed) < 12 else -1


def _to_event(request: HttpRequest, event: Event) -> HttpResponse:
    url = reverse("event", args=[event.pk])
    return HttpResponseClientRedirect(url) if request.htmx else redirect(url)
