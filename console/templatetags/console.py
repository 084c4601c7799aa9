"""Template helpers of the console's pages."""

from __future__ import annotations

import json
from dataclasses import replace
from urllib.parse import urlencode

from django import template
from django.urls import NoReverseMatch, reverse
from django.utils.html import format_html, format_html_join

from broker.reads.audit import AuditQuery

register = template.Library()

QUERY_PARAMETERS = {
    "text": "q", "model": "model", "connected": "connected", "seen": "seen",
    "verifies": "verifies", "order": "sort", "page": "page",
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


TALLY_PARTS = ("acked", "failed", "delivered", "pending", "expired")


@register.simple_tag
def tally_bar(tally) -> str:
    """An event's progress (broker.reads.progress.Tally) as a bar of its parts, in order."""
    return _bar([(part, tally.percent(part)) for part in TALLY_PARTS])


@register.simple_tag
def share_bar(percent, part: str) -> str:
    """One part (a CSS class) filling `percent` of a bar."""
    return _bar([(part, float(percent))])


def _bar(parts: list[tuple[str, float]]) -> str:
    """Parts side by side in an SVG 100 wide: their sizes are attributes, which the
    Content-Security-Policy allows where it refuses inline style."""
    starts = [sum(width for _, width in parts[:index]) for index in range(len(parts))]
    rects = format_html_join(
        "",
        '<rect class="seg {}" x="{}" width="{}" height="1"/>',
        ((part, f"{x:.2f}", f"{w:.2f}") for (part, w), x in zip(parts, starts, strict=True)),
    )
    return format_html(
        '<svg class="bar" viewBox="0 0 100 1" preserveAspectRatio="none" aria-hidden="true">'
        "{}</svg>",
        rects,
    )


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


@register.simple_tag
def section_url(params, section: str, **changes) -> str:
    """The page's query (`params`: request.GET) with a section's `sort` or `page`
    changed (a new order goes back to its first page); other sections keep theirs."""
    query = params.copy()
    if "sort" in changes:
        query.pop(f"{section}-page", None)
    for name, value in changes.items():
        query[f"{section}-{name}"] = value
        if value in ("", 1):
            del query[f"{section}-{name}"]
    return "?" + query.urlencode()


@register.filter
def cell(value, field_type: str) -> str:
    """A report's value as its field's declared type shows it (reports.results)."""
    if value is None:
        return "—"
    if field_type == "time":
        return value.strftime("%Y-%m-%d %H:%M:%S")
    if field_type == "int":
        return f"{value:,}"
    if field_type == "percent":
        return percent(value)
    if field_type == "seconds":
        return duration(value)
    if field_type == "float":
        return f"{value:,.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


@register.filter
def duration(seconds: float | None) -> str:
    """Seconds as a person reads them: 850 ms, 4.2 s, 3 min 5 s, 2 h 10 min."""
    if seconds is None:
        return ""
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {rest} s" if rest else f"{minutes} min"
    return f"{minutes // 60} h {minutes % 60} min"


@register.filter
def first_line(text: str) -> str:
    """The first line of a text (an error's what, before its where)."""
    return (text or "").strip().split("\n", 1)[0]


@register.filter
def after_first_line(text: str) -> str:
    """All but the first line of a text."""
    parts = (text or "").strip().split("\n", 1)
    return parts[1].strip() if len(parts) > 1 else ""


@register.filter
def figure_name(key: str) -> str:
    """A summary's key as words: `acked_ok` -> "acked ok"."""
    return str(key).replace("_", " ")


@register.filter
def summary_figures(summary) -> list[tuple[str, str]]:
    """A run's headline figures (its summary's numbers) as (words, shown value); the
    job's own limits are not figures."""
    if not isinstance(summary, dict):
        return []
    return [
        _figure(str(key), value)
        for key, value in summary.items()
        if isinstance(value, int | float) and not isinstance(value, bool)
        and not str(key).endswith("_limit")
    ]  # fmt: skip


def _figure(key: str, value: int | float) -> tuple[str, str]:
    """How the jobs name their figures says their unit: `_s` seconds, `_ms`
    milliseconds, a share or loss a fraction of one."""
    if key.endswith("_s"):
        return figure_name(key.removesuffix("_s")), duration(value)
    if key.endswith("_ms"):
        return figure_name(key.removesuffix("_ms")), duration(value / 1000)
    if key.endswith(("share", "loss")) and 0 <= value <= 1:
        return figure_name(key), percent(value)
    return figure_name(key), f"{value:,}" if isinstance(value, int) else f"{value:,.3g}"


@register.filter
def with_fields(values: list, fields) -> list[tuple]:
    """A report row's values beside their fields: [(value, field), ...]."""
    return list(zip(values, fields, strict=False))


# Report fields that name something with a page of its own: events by id, clients by
# name; actors and targets as the audit log writes them (`client:web-00042`).
LINKED_FIELDS = {"event": "event", "sender": "client", "receiver": "client"}
AUDIT_REFERENCE_FIELDS = frozenset({"actor", "target", "subject"})


@register.filter
def cell_link(value, field_name: str) -> str:
    """The page of what a report's cell names, or "" if none."""
    if not isinstance(value, str) or not value:
        return ""
    if field_name in AUDIT_REFERENCE_FIELDS:
        return object_url(value)
    view = LINKED_FIELDS.get(field_name)
    return _reversed(view, value) if view else ""


@register.simple_tag
def next_sort(query, field) -> str:
    """The order a click on a section's column asks for: the other direction if it is
    the order now; else numbers and times largest first, text A to Z."""
    if query.field == field.name:
        return field.name if query.descending else f"-{field.name}"
    return field.name if field.type == "text" else f"-{field.name}"


@register.simple_tag
def tokens_url(query, **changes) -> str:
    """`?state=...&sort=...&page=...` for the API tokens page's `query` with `changes`
    applied (a change of state or order goes back to the first page)."""
    if "page" not in changes:
        changes["page"] = 1
    return "?" + urlencode(query.params(**changes))
