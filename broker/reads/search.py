"""Searching the fleet: a selector in the language itself, narrowed by facets, one page
of rows at a time, with counts per facet value. The fleet page and its bulk actions
read the fleet through here, so a bulk action acts on exactly the clients shown."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial

from django.utils import timezone

from broker.models import Client
from broker.reads.clients import attributes_by_client
from broker.reads.directory import Directory, fresh_directory
from broker.reads.presence import (
    LAST_SEEN_BUCKETS,
    SIGNATURE_CHECKING,
    is_connected,
    last_seen_bucket,
)
from broker.vocabulary import search_vocabulary
from policies import PolicySyntaxError, Selector
from policies.types import format_literal

# Attributes offered as facets when some model declares them (the scenario's fleet).
FACET_ATTRIBUTES = ("software", "version", "region", "organization", "cgi")
MAX_FACET_VALUES = 12
PAGE_SIZE = 50
ORDERS = ("name", "-name", "model", "-model", "last_seen", "-last_seen")
CONNECTED, NOT_CONNECTED = "connected", "not connected"
VERIFIES_FACET = "verifies signatures"
MAX_QUERY_LENGTH = 2_000


@dataclass(frozen=True)
class FleetQuery:
    """What the operator asked for: a selector text, a model, an order and a page."""

    text: str = ""
    model: str = ""
    order: str = "name"
    page: int = 1
    connected: str = ""  # CONNECTED, NOT_CONNECTED, or "" for either
    seen: str = ""  # a LAST_SEEN_BUCKETS label, or "" for any
    verifies: str = ""  # a SIGNATURE_CHECKING label, or "" for any


@dataclass
class FacetValue:
    """One value of a facet: how many match, and the selector clause that picks it."""

    label: str
    count: int
    clause: str = ""


@dataclass
class FleetResult:
    """A page of the search, the facets of everything it matched, or the error."""

    query: FleetQuery
    total: int = 0
    rows: list[dict] = field(default_factory=list)
    facets: dict[str, list[FacetValue]] = field(default_factory=dict)
    error: PolicySyntaxError | None = None
    pages: int = 1

    @property
    def has_next(self) -> bool:
        return self.query.page < self.pages


def parse_search(text: str) -> Selector | None:
    """The search text as a selector typed by every model (None when blank); raises
    PolicySyntaxError with the line and column of the first mistake."""
    if len(text) > MAX_QUERY_LENGTH:
        raise PolicySyntaxError(f"the search is longer than {MAX_QUERY_LENGTH} characters", 1, 1)
    if not text.strip():
        return None
    return search_vocabulary().selector(text)


def matching_ids(directory: Directory, query: FleetQuery) -> set[int]:
    """Ids of the clients the query's selector, model and presence filters select."""
    ids = directory.select(parse_search(query.text))
    if query.model:
        entries = directory.entries
        ids = {client_id for client_id in ids if entries[client_id].model == query.model}
    now = timezone.now()
    if query.connected:
        wanted = query.connected == CONNECTED
        ids = {client_id for client_id in ids if directory.connected(client_id, now) == wanted}
    if query.seen:
        bucket = partial(_bucket, directory, now=now)
        ids = {client_id for client_id in ids if bucket(client_id) == query.seen}
    if query.verifies:
        checking = directory.signature_checking
        ids = {client_id for client_id in ids if checking(client_id) == query.verifies}
    return ids


def _bucket(directory: Directory, client_id: int, *, now: datetime) -> str:
    return last_seen_bucket(directory.last_seen(client_id), now)


def search_fleet(query: FleetQuery) -> FleetResult:
    """One page of the fleet for `query`, with facet counts over all that matched."""
    result = FleetResult(query=query)
    with fresh_directory() as directory:
        try:
            ids = matching_ids(directory, query)
        except PolicySyntaxError as error:
            result.error = error
            return result
        result.total = len(ids)
        result.pages = max(1, -(-len(ids) // PAGE_SIZE))
        result.facets = _facets(directory, ids)
        page_ids = _page(directory, ids, query)
        presence = {client_id: directory.presence.get(client_id) for client_id in page_ids}
    result.rows = client_rows(page_ids)
    now = timezone.now()
    for row in result.rows:
        seen = presence.get(row["client"].pk)
        row["connected"] = is_connected(seen, now)
        row["last_seen_at"] = seen.last_seen_at if seen else None
    return result


def _page(directory: Directory, ids: set[int], query: FleetQuery) -> list[int]:
    order = query.order if query.order in ORDERS else "name"
    start = (max(query.page, 1) - 1) * PAGE_SIZE
    page: list[int] = []
    for position, client_id in enumerate(directory.ordered(ids, order=order)):
        if position >= start + PAGE_SIZE:
            break
        if position >= start:
            page.append(client_id)
    return page


def _facets(directory: Directory, ids: set[int]) -> dict[str, list[FacetValue]]:
    facets = {"model": _top(directory.model_counts(ids), clause=None)}
    facets.update(_presence_facets(directory, ids))
    declared = search_vocabulary().receiver
    for name in FACET_ATTRIBUTES:
        if name in declared:
            facets[name] = _top(directory.value_counts(name, ids), clause=name)
    return facets


def _presence_facets(directory: Directory, ids: set[int]) -> dict[str, list[FacetValue]]:
    now = timezone.now()
    connected = Counter(
        CONNECTED if directory.connected(client_id, now) else NOT_CONNECTED for client_id in ids
    )
    seen = Counter(_bucket(directory, client_id, now=now) for client_id in ids)
    verifies = Counter(directory.signature_checking(client_id) for client_id in ids)
    return {
        "connected": [FacetValue(label, connected[label]) for label in (CONNECTED, NOT_CONNECTED)],
        "last seen": [FacetValue(label, seen[label]) for label in LAST_SEEN_BUCKETS if seen[label]],
        VERIFIES_FACET: [
            FacetValue(label, verifies[label]) for label in SIGNATURE_CHECKING if verifies[label]
        ],
    }


def _top(counts, *, clause: str | None) -> list[FacetValue]:
    values = []
    for value, count in counts.most_common(MAX_FACET_VALUES):
        if value is None:
            values.append(FacetValue("(none)", count, f"not {clause} exists" if clause else ""))
            continue
        text = format_literal(value)
        label = value if isinstance(value, str) else text
        values.append(FacetValue(str(label), count, f"{clause} == {text}" if clause else ""))
    return values


def client_rows(client_ids: list[int]) -> list[dict]:
    """The clients as table rows, in the given order: two queries for any page."""
    clients = Client.objects.filter(id__in=client_ids).select_related("model")
    by_id = {client.id: client for client in clients}
    values = attributes_by_client(client_ids)
    return [
        {"client": by_id[client_id], "attributes": values[client_id]}
        for client_id in client_ids
        if client_id in by_id
    ]


def receivers_chosen(
    *, client_name: str = "", selector_text: str = "", receivers_only: bool = True
) -> list[int]:
    """Ids of the clients an operation is for (a policy's receivers, an attestation's
    clients): one client by name, or every client the selector selects (that can
    receive, with `receivers_only`); raises PolicySyntaxError for a bad selector and
    LookupError for an unknown name."""
    if client_name:
        found = Client.objects.filter(name=client_name).values_list("id", flat=True).first()
        if found is None:
            raise LookupError(f"no client named {client_name!r}")
        return [found]
    with fresh_directory() as directory:
        ids = directory.select(parse_search(selector_text))
        entries = directory.entries
        return sorted(i for i in ids if entries[i].can_receive or not receivers_only)
