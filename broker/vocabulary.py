"""The service's vocabulary: one type per attribute name, per scope, and the texts
parsed with it (docs/addressing.md).

Selectors, policies and summaries are always parsed here, so that what was accepted
when it was saved or published is what routes: a literal "2.4" compared with a version
attribute is a version everywhere, never text. Pure Python; `broker.selectors.vocabulary`
reads the current one from the database.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TypeVar

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
