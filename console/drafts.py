"""Reading a send as the operator typed it on the send page into a `Draft`: content as
key/value rows typed by the declared event attributes, or as JSON; the lifetime as a
whole number of seconds. Each mistake says which field is wrong."""

from __future__ import annotations

import json
import math
from typing import Any

from django.http import QueryDict

from broker.errors import InvalidInput, NotFound
from broker.models import Client
from broker.services.sending import Draft
from broker.vocabulary import event_vocabulary

JSON_MODE = "json"
TRUE_WORDS = {"true": True, "false": False}


def draft_from(params: QueryDict) -> Draft:
    """The draft in a send form's fields; InvalidInput or NotFound naming the field."""
    return Draft(
        sender=_sender(params.get("sender", "")),
        content=content_from(params),
        selector=params.get("selector", ""),
        lifetime_s=_whole_number(params.get("lifetime_s", ""), field="lifetime_s"),
        channel=params.get("channel", "").strip() or "default",
    )


def content_from(params: QueryDict) -> dict[str, Any]:
    """The content, from the JSON box or from the name/value rows."""
    if params.get("content_mode") == JSON_MODE:
        return _content_from_json(params.get("content_json", ""))
    names = params.getlist("content_name")
    values = params.getlist("content_value")
    declared = event_vocabulary()
    content: dict[str, Any] = {}
    for name, text in zip(names, values, strict=False):
        name = name.strip()
        if not name and not text.strip():
            continue  # an empty row
        if not name:
            raise InvalidInput(f"the value {text!r} has no name", field="content")
        if name in content:
            raise InvalidInput(f"{name} is given twice", field=f"content.{name}")
        content[name] = typed_value(text, declared.get(name), field=f"content.{name}")
    return content


def typed_value(text: str, declared: str | None, *, field: str) -> Any:
    """A row's text as the value its declared type wants; an undeclared attribute's
    text is a number or true/false if it reads as one, else text."""
    text = text.strip()
    if declared == "int":
        return _whole_number(text, field=field)
    if declared == "float":
        return _number(text, field=field)
    if declared == "bool":
        if text.lower() not in TRUE_WORDS:
            raise InvalidInput(f"{field} must be true or false, not {text!r}", field=field)
        return TRUE_WORDS[text.lower()]
    if declared is None:
        return _literal(text)
    return text


def _literal(text: str) -> Any:
    if text.lower() in TRUE_WORDS:
        return TRUE_WORDS[text.lower()]
    try:
        number = json.loads(text)
    except ValueError:
        return text
    is_number = isinstance(number, int | float) and not isinstance(number, bool)
    return number if is_number and math.isfinite(number) else text


def _content_from_json(text: str) -> dict[str, Any]:
    try:
        content = json.loads(text)
    except ValueError as error:
        raise InvalidInput(
            f"the content is not JSON: {error.msg} at line {error.lineno}, column {error.colno}",
            field="content_json",
        ) from None
    if not isinstance(content, dict):
        raise InvalidInput("the content must be a JSON object", field="content_json")
    return content


def _sender(name: str) -> Client:
    sender = Client.objects.filter(name=name.strip()).first() if name.strip() else None
    if sender is None:
        raise NotFound(f"no sender client named {name!r}", field="sender")
    return sender


def _whole_number(text: str, *, field: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise InvalidInput(f"{field} must be a whole number, not {text!r}", field=field) from None


def _number(text: str, *, field: str) -> float:
    try:
        number = float(text.strip())
    except ValueError:
        number = math.nan
    if not math.isfinite(number):
        raise InvalidInput(f"{field} must be a number, not {text!r}", field=field)
    return number
