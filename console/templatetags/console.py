"""Template helpers of the console's pages."""

from __future__ import annotations

import json
from dataclasses import replace
from urllib.parse import urlencode

from django import template
from django.urls import NoReverseMatch, reverse

from broker.audit_log import AuditQuery

register = template.Library()

QUERY_PARAMETERS = {
    "text": "q", "model": "model", "connected": "connected", "seen": "seen",
    "order": "sort", "page": "page",
}  # fmt: skip
DETAIL_TEXT = 60  # characters of a detail's value shown in the audit log's table
SHOWN_DETAIL_NAMES = 3
DETAILS_SHOWN = 4_000  # characters of the details in full


@register.simple_tag
def search_url(query, **changes) -> str:
    """`?q=...&model=...&sort=...&page=...` for `query` with `changes` applied (a
    change of search or order goes back to the first page)."""
    values = {field: getattr(query, field) for field in QUERY_PARAMETERS}
    if "page" not in changes and changes:
        values["page"] = 1
    values.update(changes)
    pairs = {QUERY_PARAMETERS[f]: v for f, v in values.items() if v not in ("", None)}
    if pairs.get("page") == 1:
        del pairs["page"]
    if pairs.get("sort") == "name":
        del pairs["sort"]
    return "?" + urlencode(pairs)


@register.simple_tag
def narrowed(text: str, clause: str) -> str:
    """The search `text` with `clause` added (and-ed), as the facet links need."""
    return f"({text}) and {clause}" if text.strip() else clause


@register.filter
def caret(column: int) -> str:
    """A line pointing at a 1-based column: where the error is."""
    return " " * (max(int(column), 1) - 1) + "^"


@register.filter
def literal(value) -> str:
    """A value as the policy language writes it (true, 2.4, text without quotes)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


@register.filter
def width_of(tally, part: str) -> str:
    """A part of a tally (broker.progress.Tally) as a CSS width: "12.50"."""
    return f"{tally.percent(part):.2f}"


@register.simple_tag
def audit_url(query: AuditQuery, **changes) -> str:
    """`?actor=...&from=...` for the audit log's `query` with `changes` applied (a
    change of filter or order goes back to the newest page)."""
    changed = replace(query, **{"after": None, "before": None, **changes})
    return "?" + urlencode(changed.params())


@register.simple_tag
def object_url(reference: str, details=None) -> str:
    """The page of what an audit entry's actor or target names (`client:web-00042`,
    `event:<uuid>`, `authority:...`, `model:...`, or `clients:12` chosen by the
    selection its details state), or "" if there is none (or it does not exist yet)."""
    kind, _, name = reference.partition(":")
    if not name:
        return ""
    if kind in ("client", "event"):  # the url names of their pages
        return _reversed(kind, name)
    if kind == "authority":
        return _reversed("trust")
    if kind == "model":
        return _with_query(_reversed("fleet"), model=name)
    if kind == "clients" and isinstance(details, dict):
        return _selection_url(str(details.get("selection", "")))
    return ""


def _reversed(view: str, *args: str) -> str:
    try:
        return reverse(view, args=args)
    except NoReverseMatch:  # a name no URL can hold, or a page not in this version
        return ""


def _with_query(url: str, **params: str) -> str:
    return f"{url}?{urlencode(params)}" if url else ""


def _selection_url(selection: str) -> str:
    """The clients a bulk change chose: one by name (`client web-00042`, as the policy
    editor says it) or those a selector selects."""
    if selection.startswith("client "):
        return _reversed("client", selection.removeprefix("client "))
    return _with_query(_reversed("fleet"), q=selection) if selection else ""


@register.filter
def detail_items(details) -> list[tuple[str, str]]:
    """An audit entry's details as short (name, value) pairs; lists of names (from
    broker.audit.listed) said as a count and the first few."""
    if not isinstance(details, dict):
        return [("", _short(details))]
    return [(str(name), _short(value)) for name, value in details.items()]


def _short(value) -> str:
    if isinstance(value, dict) and set(value) == {"names", "unlisted"}:
        names = value["names"]
        count = len(names) + value["unlisted"]
        more = "…" if count > SHOWN_DETAIL_NAMES else ""
        return f"{count}: {', '.join(map(str, names[:SHOWN_DETAIL_NAMES]))}{more}"
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return text if len(text) <= DETAIL_TEXT else text[: DETAIL_TEXT - 1] + "…"


@register.filter
def details_json(details) -> str:
    """An audit entry's details in full, as indented JSON (cut at DETAILS_SHOWN)."""
    text = json.dumps(details, ensure_ascii=False, indent=1)
    return text if len(text) <= DETAILS_SHOWN else text[:DETAILS_SHOWN] + "\n… (the CSV has it all)"


@register.filter
def percent(share: float | None) -> str:
    """A share (0.125) as a percentage ("12.5%"); empty for None."""
    return "" if share is None else f"{share * 100:.1f}%"
