"""Template helpers of the console's pages."""

from __future__ import annotations

from urllib.parse import urlencode

from django import template

register = template.Library()

QUERY_PARAMETERS = {
    "text": "q", "model": "model", "connected": "connected", "seen": "seen",
    "order": "sort", "page": "page",
}  # fmt: skip


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
def percent(share: float | None) -> str:
    """A share (0.125) as a percentage ("12.5%"); empty for None."""
    return "" if share is None else f"{share * 100:.1f}%"
