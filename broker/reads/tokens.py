"""API tokens of clients and of operators, for the API tokens page: both kinds in one
table, live or all, the newest first or by expiry or last use, a page at a time."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime

from django.core.paginator import Page, Paginator
from django.db.models import CharField, F, QuerySet, Value
from django.db.models.functions import Cast, Now
from django.utils import timezone

from broker.models import ClientToken, OperatorToken

CLIENT = "client"
OPERATOR = "operator"
TOKENS_PER_PAGE = 50
# The orders the page offers, by their name in its address.
ORDERS = {
    "newest": (F("issued_at").desc(), F("token_id").desc()),
    "expiring": (F("expiry").asc(), F("token_id").asc()),
    "last-used": (F("used_at").desc(nulls_last=True), F("token_id").desc()),
}


@dataclass(frozen=True)
class TokenQuery:
    """What the page lists: live tokens only or all, in which order, which page; and
    whose operator tokens (None: everyone's, for whoever manages accounts)."""

    live_only: bool = True
    order: str = "newest"
    page: int = 1
    operator_tokens_of: int | None = None

    @classmethod
    def from_params(cls, params, *, operator_tokens_of: int | None) -> TokenQuery:
        """The query a link's parameters state; anything unreadable falls back."""
        order = params.get("sort", "newest")
        page = params.get("page", "1")
        return cls(
            live_only=params.get("state", "live") != "all",
            order=order if order in ORDERS else "newest",
            page=int(page) if page.isdigit() and 0 < len(page) < 7 else 1,
            operator_tokens_of=operator_tokens_of,
        )

    def params(self, **changes) -> dict[str, str]:
        """This query's link parameters, with `changes` (of its fields) applied."""
        query = replace(self, **changes)
        return {
            "state": "live" if query.live_only else "all",
            "sort": query.order,
            "page": str(query.page),
        }


@dataclass(frozen=True)
class TokenRow:
    """One token as the page lists it."""

    kind: str  # CLIENT or OPERATOR
    id: int
    holder: str  # the client's name, or the operator's username
    label: str
    created_at: datetime
    expires_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None

    @property
    def is_live(self) -> bool:
        return self.revoked_at is None and self.expires_at > timezone.now()


def token_page(query: TokenQuery) -> Page:
    """The page of tokens `query` asks for, as TokenRows."""
    rows = _client_rows(query).union(_operator_rows(query), all=True)
    ordered = rows.order_by(*ORDERS[query.order])
    paginator = Paginator(ordered, TOKENS_PER_PAGE)
    page = paginator.get_page(query.page)
    page.object_list = [_row(values) for values in page.object_list]
    return page


def _row(values: dict) -> TokenRow:
    return TokenRow(
        kind=values["kind"],
        id=values["token_id"],
        holder=values["holder"],
        label=values["label_text"],
        created_at=values["issued_at"],
        expires_at=values["expiry"],
        last_used_at=values["used_at"],
        revoked_at=values["revoked"],
    )


def _live(tokens: QuerySet) -> QuerySet:
    return tokens.filter(revoked_at__isnull=True, expires_at__gt=Now())


def _client_rows(query: TokenQuery) -> QuerySet:
    tokens = _live(ClientToken.objects) if query.live_only else ClientToken.objects.all()
    return _as_rows(tokens, kind=CLIENT, holder=F("client__name"), label=Value(""))


def _operator_rows(query: TokenQuery) -> QuerySet:
    tokens = _live(OperatorToken.objects) if query.live_only else OperatorToken.objects.all()
    if query.operator_tokens_of is not None:
        tokens = tokens.filter(user_id=query.operator_tokens_of)
    return _as_rows(tokens, kind=OPERATOR, holder=F("user__username"), label=F("label"))


def _as_rows(tokens: QuerySet, *, kind: str, holder, label) -> QuerySet:
    """Both kinds with the same columns in the same order (a UNION needs them so):
    every column an annotation (named apart from the models' fields, which an
    annotation may not shadow), selected in the order written here."""
    text = CharField()
    columns = {
        "kind": Value(kind, output_field=text),
        "token_id": F("id"),
        "holder": holder,
        "label_text": Cast(label, output_field=text),
        "issued_at": F("created_at"),
        "expiry": F("expires_at"),
        "used_at": F("last_used_at"),
        "revoked": F("revoked_at"),
    }
    return tokens.annotate(**columns).values(*columns)
