"""The fleet's directory: every client's name, model and live attributes, held in memory
and indexed for selector search, so that the console searches 100,000 clients by the
language itself in milliseconds.

It is built once per process from PostgreSQL and kept fresh from the `ClientChange`
log exactly as the leaf dispatchers keep theirs (broker.dispatch.state): before each use
it reads the changes of transactions not surely seen before. Selection is the leaves'
own `Matcher`, so a search selects what an event with that selector would address.
Nothing here is authoritative: a process that loses it rebuilds it.
"""

from __future__ import annotations

import threading
from bisect import insort
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import NamedTuple

from broker.models import AgentPresence, Client, Dispatcher
from broker.reads.clients import (
    LogRead,
    attributes_by_client,
    clients_changed_since,
    snapshot_xmin,
)
from broker.reads.policies import newest_policies
from broker.reads.presence import is_connected, verifies_signatures
from policies import Matcher, Policy, Selector
from policies.expressions import Always

# The directory selects; it never decides acceptance, so every client shares one policy.
NO_POLICY = Policy(Always(False))
ENTRY_FIELDS = ("id", "name", "model__name", "can_send", "can_receive", "is_active")


class Seen(NamedTuple):
    """A client's presence, as `broker.reads.presence.is_connected` reads it, and
    what its agent acts on (broker.reads.presence.verifies_signatures)."""

    sessions: int
    last_seen_at: datetime
    acts_on: str = ""


SEEN_FIELDS = ("client_id", "sessions", "last_seen_at", "acts_on", "updated_at")
PRESENCE_OVERLAP = timedelta(seconds=30)
NEVER = datetime.min.replace(tzinfo=UTC)


@dataclass(frozen=True)
class Entry:
    """What the fleet page shows of a client without asking the database."""

    id: int
    name: str
    model: str
    can_send: bool
    can_receive: bool
    is_active: bool


class Directory:
    """Every client, by id: its entry, its live attributes in a Matcher, and the
    canonical text of its current policy (receivers that have one)."""

    def __init__(self) -> None:
        self.matcher = Matcher()
        self.entries: dict[int, Entry] = {}
        self.policies: dict[int, str] = {}
        self.presence: dict[int, Seen] = {}
        self._presence_read_to: datetime | None = None
        self._by_name: list[tuple[str, int]] = []
        self.horizon = snapshot_xmin()
        self.last_read = LogRead.now()
        self._reload(list(Client.objects.values_list("id", flat=True)))
        self.refresh_presence()

    def refresh(self) -> set[int]:
        """Apply the changes not surely seen before; return the changed client ids."""
        leaves = Dispatcher.objects.filter(is_leaf=True).values("id")
        reading = LogRead.now()
        self.horizon, changed = clients_changed_since(self.horizon, leaves, last=self.last_read)
        self.last_read = reading
        if changed:
            self._reload(changed)
        self.refresh_presence()
        return changed

    def refresh_presence(self) -> None:
        """Read the presence rows written since the last read (all, the first time)."""
        rows = AgentPresence.objects.order_by("updated_at")
        if self._presence_read_to is not None:
            # A write's time is its transaction's start: ask again from a little before.
            rows = rows.filter(updated_at__gte=self._presence_read_to - PRESENCE_OVERLAP)
        for client_id, *seen, updated_at in rows.values_list(*SEEN_FIELDS):
            self.presence[client_id] = Seen(*seen)
            self._presence_read_to = updated_at

    def connected(self, client_id: int, now: datetime) -> bool:
        """Whether the client's agent is connected now (broker.reads.presence.is_connected)."""
        return is_connected(self.presence.get(client_id), now)

    def acts_on(self, client_id: int) -> str:
        """What the client's agent said it acts on at its last login ("": unknown)."""
        seen = self.presence.get(client_id)
        return "" if seen is None else seen.acts_on

    def signature_checking(self, client_id: int) -> str:
        """Whether the client's agent verifies signatures, as the console says it
        (broker.reads.presence.verifies_signatures)."""
        return verifies_signatures(self.acts_on(client_id))

    def last_seen(self, client_id: int) -> datetime | None:
        """When the client's agent was last seen (None: never)."""
        seen = self.presence.get(client_id)
        return None if seen is None else seen.last_seen_at

    def outdated(self) -> bool:
        """Whether clients were deleted behind its back (they never are, but a test
        database is emptied between tests): then it must be built anew."""
        return Client.objects.count() < len(self.entries)

    def select(self, selector: Selector | None) -> set[int]:
        """Ids of the clients the selector selects (all of them for None)."""
        return self.matcher.selected(selector)

    def ordered(self, ids: set[int], *, order: str) -> Iterator[int]:
        """`ids` by name, or by model then name; a leading '-' reverses."""
        descending = order.startswith("-")
        if order.lstrip("-") == "model":
            return iter(sorted(ids, key=self._model_key, reverse=descending))
        if order.lstrip("-") == "last_seen":
            return iter(sorted(ids, key=self._seen_key, reverse=descending))
        names = reversed(self._by_name) if descending else iter(self._by_name)
        return (client_id for _, client_id in names if client_id in ids)

    def _seen_key(self, client_id: int) -> tuple[datetime, str]:
        return self.last_seen(client_id) or NEVER, self.entries[client_id].name

    def _model_key(self, client_id: int) -> tuple[str, str]:
        entry = self.entries[client_id]
        return entry.model, entry.name

    def value_counts(self, name: str, ids: set[int]) -> Counter:
        """How many of `ids` hold each value of attribute `name` (None: no value)."""
        return self.matcher.value_counts(name, ids)

    def model_counts(self, ids: set[int]) -> Counter:
        """How many of `ids` are of each model."""
        entries = self.entries
        return Counter(entries[client_id].model for client_id in ids)

    def _reload(self, client_ids: list[int]) -> None:
        added: list[tuple[str, int]] = []
        for chunk in _chunks(client_ids, 20_000):
            entries = {
                row[0]: Entry(*row)
                for row in Client.objects.filter(id__in=chunk).values_list(*ENTRY_FIELDS)
            }
            attributes = attributes_by_client(chunk)
            self._read_policies(chunk)
            for client_id in chunk:
                entry = entries.get(client_id)
                if entry is not None and client_id not in self.entries:
                    added.append((entry.name, client_id))
                self._apply(client_id, entry, attributes.get(client_id, {}))
        self._add_names(added)

    def _read_policies(self, chunk: list[int]) -> None:
        texts: dict[str, str] = {}  # one string per distinct text: most share one
        for client_id, text in newest_policies(chunk).items():
            self.policies[client_id] = texts.setdefault(text, text)

    def policy_groups(self, ids: set[int]) -> dict[str | None, set[int]]:
        """{current canonical policy text (None: no policy yet): those of `ids` with it}."""
        groups: dict[str | None, set[int]] = {}
        policies = self.policies
        for client_id in ids:
            groups.setdefault(policies.get(client_id), set()).add(client_id)
        return groups

    def _add_names(self, added: list[tuple[str, int]]) -> None:
        # Names never change: the order is kept by insertion, or one sort for many.
        if len(added) > 64:
            self._by_name = sorted(self._by_name + added)
            return
        for item in added:
            insort(self._by_name, item)

    def _apply(self, client_id: int, entry: Entry | None, attributes: dict) -> None:
        if entry is None:  # clients are never deleted, but a test database may be flushed
            self._forget(client_id)
            return
        self.entries[client_id] = entry
        if client_id in self.matcher:
            self.matcher.update(client_id, attributes)
        else:
            self.matcher.add(client_id, attributes, NO_POLICY)

    def _forget(self, client_id: int) -> None:
        entry = self.entries.pop(client_id, None)
        self.policies.pop(client_id, None)
        self.presence.pop(client_id, None)
        if entry is not None:
            self._by_name.remove((entry.name, client_id))
            self.matcher.remove(client_id)


def _chunks(ids: Iterable[int], size: int) -> Iterator[list[int]]:
    chunk: list[int] = []
    for client_id in ids:
        chunk.append(client_id)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


_directory: Directory | None = None
_lock = threading.Lock()


@contextmanager
def fresh_directory() -> Iterator[Directory]:
    """This process's directory, brought up to date, held for the caller alone."""
    global _directory
    with _lock:
        if _directory is not None and _directory.last_read.stale():
            _directory = None
        if _directory is not None:
            _directory.refresh()
        # Checked after the refresh: a flushed database refilled with as many clients
        # as before is only seen once the new ones have been added beside the old.
        if _directory is None or _directory.outdated():
            _directory = Directory()
        yield _directory


def forget_directory() -> None:
    """Drop this process's directory; the next use rebuilds it (tests, after a flush)."""
    global _directory
    with _lock:
        _directory = None
