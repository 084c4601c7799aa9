"""The service's vocabulary: one type per attribute name, per scope (docs/addressing.md),
and its one owner: loading it from PostgreSQL, knowing when it is stale, caching it and
the texts parsed with it, and typing a stored selector or policy.

Selectors, policies and summaries are always parsed here, so that what was accepted
when it was saved or published is what routes: a literal "2.4" compared with a version
attribute is a version everywhere, never text. The tree, the pages and the API all ask
this module; none keeps a vocabulary of its own.

A process keeps the vocabulary it read with the *stamp* it read it at (counts and
maximum ids of the tables it comes from, `VOCABULARY_STAMP`): `vocabulary()` asks for
the stamp (one short query) and reads again only when it moved. Two kinds of callers
skip the question, and each knows how to recover:
- routing (`routing_vocabulary`, `routed_selector`) uses what was read at most
  FRESH_FOR_S ago, and reads again at once when a text uses a name it does not know;
- publishing (`stamped_vocabulary(ask=False)`) checks the stamp in its own statement,
  and `refused_only_if_current` checks a refused text again under a newer vocabulary,
  so that a vocabulary read before another process (a bulk load, say) declared a name
  never refuses what the current one accepts.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from django.conf import settings
from django.db import connection

from broker.models import ClientModel, EventAttribute, ModelAttribute
from policies import (
    AttributeType,
    Policy,
    PolicySyntaxError,
    Selector,
    parse_policy,
    parse_selector,
)
from policies.expressions import Always
from policies.types import normalize_model

log = logging.getLogger(__name__)

MAX_CACHED_TEXTS = 10_000

Parsed = TypeVar("Parsed", Policy, Selector)


class Vocabulary:
    """`{name: type}` of receivers (what selectors address), of senders (`sender.x` in
    policies) and of event content (`event.x` in policies and published content).

    Parses are cached on the instance: a process replaces its vocabulary when the
    content changes, so every cache of parsed text is keyed by vocabulary as well.
    """

    def __init__(
        self,
        *,
        receiver: Mapping[str, str | AttributeType],
        sender: Mapping[str, str | AttributeType],
        event: Mapping[str, str | AttributeType],
    ) -> None:
        self.receiver = normalize_model(receiver)
        self.sender = normalize_model(sender)
        self.event = normalize_model(event)
        self.key = tuple(frozenset(m.items()) for m in (self.receiver, self.sender, self.event))
        self._selectors: dict[str, Selector] = {}
        self._policies: dict[str, Policy] = {}

    def selector(self, text: str) -> Selector:
        """The selector `text` typed by the receivers' vocabulary; raises
        PolicySyntaxError (or its PolicyTypeError) with the position."""
        return _cached(self._selectors, text, self._parse_selector)

    def policy(self, text: str) -> Policy:
        """The policy `text` typed by the senders' and the events' vocabularies."""
        return _cached(self._policies, text, self._parse_policy)

    def stored_selector(self, text: str) -> Selector:
        """A selector accepted earlier. Should it no longer type-check (names keep
        their types, so only a removed model could cause it), it is logged and
        selects nothing: a leaf must not fail on it."""
        try:
            return self.selector(text)
        except PolicySyntaxError as error:
            log.error("a stored selector no longer type-checks, it selects nothing: %s", error)
            return Selector(Always(False))

    def stored_policy(self, text: str) -> Policy:
        """A policy saved earlier; one that no longer type-checks accepts nothing."""
        try:
            return self.policy(text)
        except PolicySyntaxError as error:
            log.error("a stored policy no longer type-checks, it accepts nothing: %s", error)
            return Policy(Always(False))

    def _parse_selector(self, text: str) -> Selector:
        return parse_selector(text, receiver_model=self.receiver)

    def _parse_policy(self, text: str) -> Policy:
        return parse_policy(text, sender_model=self.sender, event_model=self.event)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vocabulary) and self.key == other.key

    def __hash__(self) -> int:
        return hash(self.key)

    def __repr__(self) -> str:
        sizes = ", ".join(f"{len(m)} {scope}" for scope, m in zip(SCOPES, self.key, strict=True))
        return f"<Vocabulary {sizes}>"


SCOPES = ("receiver", "sender", "event")


def _cached(cache: dict[str, Parsed], text: str, parse: Callable[[str], Parsed]) -> Parsed:
    # Errors are not cached: a refused text is parsed again, and refused again.
    parsed = cache.get(text)
    if parsed is None:
        if len(cache) >= MAX_CACHED_TEXTS:
            cache.clear()
        parsed = cache[text] = parse(text)
    return parsed


# ---------------------------------------------------------------------------
# Loading: what the declared models and event attributes say.


def receiver_vocabulary() -> dict[str, str]:
    """{name: type} declared by the models of clients that can receive (active or
    not: clients are never deleted, so the vocabulary only grows)."""
    return _role_vocabulary(has_receivers=True)


def sender_vocabulary() -> dict[str, str]:
    """{name: type} declared by the models of clients that can send."""
    return _role_vocabulary(has_senders=True)


def event_vocabulary() -> dict[str, str]:
    """{name: type} of the declared event attributes."""
    return dict(EventAttribute.objects.values_list("name", "type"))


def _role_vocabulary(**role: bool) -> dict[str, str]:
    rows = ModelAttribute.objects.filter(**{f"model__{k}": v for k, v in role.items()})
    return dict(rows.order_by().values_list("name", "type").distinct())


def model_vocabulary() -> dict[str, str]:
    """{name: type} declared by any model: what the fleet is searched by (controllers'
    attributes too, though no event addresses them)."""
    return dict(ModelAttribute.objects.order_by().values_list("name", "type").distinct())


# ---------------------------------------------------------------------------
# The current vocabulary, cached per process.

_known: dict[str, tuple[tuple, Vocabulary]] = {}


def vocabulary() -> Vocabulary:
    """The current vocabulary, cached per process and read again when a model
    attribute or an event attribute was added or removed, or a model got its first
    receiver or sender, since (one short query tells). The same content keeps the same
    object, and so its parse caches."""
    return stamped_vocabulary()[1]


def stamped_vocabulary(*, ask: bool = True) -> tuple[tuple, Vocabulary]:
    """`vocabulary()` with the stamp it was read at. With ask=False, as last read,
    without asking whether it changed since (read now if it never was): for a writer
    that checks the stamp in its own statement (`VOCABULARY_STAMP`) and asks again if
    it moved, and that checks a refusal again (`refused_only_if_current`)."""
    known = _known.get("routing")
    if known is not None and not ask:
        return known
    return _current("routing", _routing_vocabulary)


def vocabulary_at(stamp: Sequence[Any]) -> Vocabulary:
    """The routing vocabulary as `stamp` says it is, the stamp read by the caller's own
    statement (`STAMP_COLUMNS`) with what the vocabulary types: the one this process
    holds if the stamp has not moved, without a query of its own. A leaf's pass typed
    its receivers, the live selectors and its stored summary with a stamp read each
    time on its own: three round trips of six counts, a sixth of the pass."""
    return _current("routing", _routing_vocabulary, stamp=tuple(stamp))[1]


def search_vocabulary() -> Vocabulary:
    """The vocabulary the fleet is searched with: selectors typed by every model."""
    build = lambda: Vocabulary(receiver=model_vocabulary(), sender={}, event={})  # noqa: E731
    return _current("search", build)[1]


def _routing_vocabulary() -> Vocabulary:
    return Vocabulary(
        receiver=receiver_vocabulary(), sender=sender_vocabulary(), event=event_vocabulary()
    )


def _current(kind: str, build, stamp: tuple | None = None) -> tuple[tuple, Vocabulary]:
    # The stamp is read first: what is built is at least as new as the stamp says.
    if stamp is None:
        stamp = _vocabulary_stamp()
    known = _known.get(kind)
    if known is not None and known[0] == stamp:
        return known
    fresh = build()
    if known is not None and known[1] == fresh:
        fresh = known[1]
    _known[kind] = (stamp, fresh)
    return stamp, fresh


def _vocabulary_stamp() -> tuple:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {', '.join(VOCABULARY_STAMP)}")
        return cursor.fetchone()


def _stamp_parts() -> tuple[str, ...]:
    # Sequences never hand out an id twice, so a new row always moves a maximum; the
    # counts see removals. Which models receive and send is read from their flags
    # (kept by a trigger, see ClientModel), not from the clients: counting 100,000
    # clients would cost every publish, and their largest id misses a client whose
    # transaction took its id before another's and committed after it.
    tables = [ModelAttribute._meta.db_table, EventAttribute._meta.db_table]
    parts = []
    for table in tables:
        parts += [f"(SELECT count(*) FROM {table})", f"(SELECT max(id) FROM {table})"]
    models = ClientModel._meta.db_table
    roles = [f"(SELECT count(*) FROM {models} WHERE {flag})" for flag in ROLE_FLAGS]
    return (*parts, *roles)


ROLE_FLAGS = ("has_receivers", "has_senders")


# What the vocabulary is read from: SQL expressions, each a number (NULL for none).
VOCABULARY_STAMP = _stamp_parts()
# The same as columns of a statement that reads what the vocabulary types (selectors,
# policies, summaries), so that `vocabulary_at` is at least as new as what it read.
_STAMP_NAMES = [f"vocabulary_stamp_{n}" for n in range(len(VOCABULARY_STAMP))]
STAMP_COLUMNS = ", ".join(
    f"{part} AS {name}" for part, name in zip(VOCABULARY_STAMP, _STAMP_NAMES, strict=True)
)


def stamp_of(row: Any) -> tuple:
    """The stamp a model instance read with STAMP_COLUMNS (a raw query's) carries."""
    return tuple(getattr(row, name) for name in _STAMP_NAMES)


Checked = TypeVar("Checked")


def refused_only_if_current(
    check: Callable[[Vocabulary], Checked], stamp: tuple, words: Vocabulary
) -> tuple[Checked, tuple, Vocabulary]:
    """`check(words)` for a vocabulary read without asking whether it is still current
    (`stamped_vocabulary(ask=False)`); returns what it returned, with the stamp and
    vocabulary it passed under. Should it refuse (raise), the refusal stands only if
    the vocabulary did not move since: otherwise it is checked again under the current
    one. A process that read the vocabulary before another declared a name (a bulk
    load of receivers, a new model) must not refuse a text that uses it."""
    try:
        return check(words), stamp, words
    except Exception:
        current_stamp, current = stamped_vocabulary()
        if current_stamp == stamp:
            raise
    return check(current), current_stamp, current


# ---------------------------------------------------------------------------
# Routing: what a process read at most FRESH_FOR_S ago.

# How long a process routes with what it read of the vocabulary (and the tree's state
# of the summaries, broker.dispatch.state) without asking PostgreSQL again: this keeps
# inner dispatchers off the database.
FRESH_FOR_S = settings.TREE_FRESH_FOR_MS / 1000

_routing: tuple[float, Vocabulary] | None = None


def routing_vocabulary(*, fresh: bool = False) -> Vocabulary:
    """The vocabulary as read at most FRESH_FOR_S ago (or now, if `fresh`)."""
    global _routing
    if fresh or _routing is None or time.monotonic() - _routing[0] > FRESH_FOR_S:
        _routing = (time.monotonic(), vocabulary())
    return _routing[1]


# ---------------------------------------------------------------------------
# Typing stored texts: the one way a stored selector becomes a typed one again.


def stored_selector(text: str, words: Vocabulary | None = None) -> Selector | None:
    """A stored event's selector typed by `words` (the current vocabulary if None;
    parses are cached there); None if the event has none."""
    if not text:
        return None
    return (words or vocabulary()).stored_selector(text)


def routed_selector(text: str) -> Selector | None:
    """A stored selector typed for routing (`routing_vocabulary`); None if there is
    none. A name the cached vocabulary does not know yet is looked up again before
    giving up."""
    if not text:
        return None
    try:
        return routing_vocabulary().selector(text)
    except PolicySyntaxError:
        return routing_vocabulary(fresh=True).stored_selector(text)
