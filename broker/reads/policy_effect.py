"""What saving a policy would change, shown before it is saved: over recent events,
which senders and events the chosen receivers would newly accept or newly refuse.

Acceptance depends only on the sender's attested attributes and the content, so each
distinct current policy among the receivers is evaluated once per event; the event's
selector then says how many of that policy's receivers it addressed (the directory).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import timedelta

from django.utils import timezone

from broker.models import Event
from broker.reads.directory import Directory, fresh_directory
from broker.reads.progress import recent_events
from broker.vocabulary import search_vocabulary, vocabulary
from policies import Policy, PolicySyntaxError

RECENT_EVENTS = 500
RECENT_WINDOW = timedelta(days=7)


@dataclass
class EventChange:
    """One recent event whose fate changes for `receivers` of the chosen clients."""

    event: Event
    receivers: int


@dataclass
class PolicyEffect:
    """Newly accepted and newly refused recent events, and the senders behind them."""

    considered: int = 0
    newly_accepted: list[EventChange] = field(default_factory=list)
    newly_refused: list[EventChange] = field(default_factory=list)

    def senders(self, changes: list[EventChange]) -> dict[str, int]:
        """{sender name: receivers affected} for a list of changes."""
        counts: dict[str, int] = defaultdict(int)
        for change in changes:
            counts[change.event.sender.name] += change.receivers
        return dict(sorted(counts.items()))

    @property
    def senders_accepted(self) -> dict[str, int]:
        return self.senders(self.newly_accepted)

    @property
    def senders_refused(self) -> dict[str, int]:
        return self.senders(self.newly_refused)


def policy_effect(*, client_ids: set[int], new: Policy) -> PolicyEffect:
    """The effect of giving all of `client_ids` the policy `new`, over the most recent
    events (at most RECENT_EVENTS, of the last RECENT_WINDOW)."""
    events = _recent_events()
    words = vocabulary()
    effect = PolicyEffect(considered=len(events))
    with fresh_directory() as directory:
        groups = [
            (None if text is None else words.stored_policy(text), members)
            for text, members in directory.policy_groups(client_ids).items()
        ]
        addressed = _Addressed(directory, groups)
        for event in events:
            accepted, refused = _event_change(addressed, event, groups, new)
            if accepted:
                effect.newly_accepted.append(EventChange(event, accepted))
            if refused:
                effect.newly_refused.append(EventChange(event, refused))
    return effect


def _recent_events() -> list[Event]:
    since = timezone.now() - RECENT_WINDOW
    return list(recent_events().filter(published_at__gte=since)[:RECENT_EVENTS])


def current_policy_groups(client_ids: set[int]) -> dict[str | None, set[int]]:
    """{current canonical policy text (None: no policy yet): its receivers among
    client_ids}, from the directory."""
    with fresh_directory() as directory:
        return directory.policy_groups(client_ids)


def _event_change(
    addressed: _Addressed, event: Event, groups: list[tuple[Policy | None, set[int]]], new: Policy
) -> tuple[int, int]:
    """(receivers newly accepting, receivers newly refusing) `event`, of those its
    selector addressed."""
    now_accepts = new.accepts(event.sender_attributes, event.content)
    accepted = refused = 0
    for index, (old, _) in enumerate(groups):
        was_accepting = old is not None and old.accepts(event.sender_attributes, event.content)
        if was_accepting == now_accepts:
            continue
        count = addressed.count(event, index)
        if now_accepts:
            accepted += count
        else:
            refused += count
    return accepted, refused


class _Addressed:
    """How many of a group's receivers an event's selector addresses, counted once per
    selector and group: recent events mostly repeat a few selectors."""

    def __init__(self, directory: Directory, groups: list[tuple[Policy | None, set[int]]]):
        self.directory = directory
        self.groups = groups
        self.counts: dict[tuple[str, int], int] = {}
        self.selected: dict[str, set[int]] = {}
        self.words = search_vocabulary()

    def count(self, event: Event, group: int) -> int:
        key = (event.selector.strip(), group)
        if key not in self.counts:
            self.counts[key] = self._count(*key)
        return self.counts[key]

    def _count(self, text: str, group: int) -> int:
        members = self.groups[group][1]
        return len(members) if not text else len(members & self._selected(text))

    def _selected(self, text: str) -> set[int]:
        # One selection per selector, whatever the number of groups it is counted in.
        if text not in self.selected:
            try:
                self.selected[text] = self.directory.select(self.words.selector(text))
            except PolicySyntaxError:  # no longer types: it addresses no one now
                self.selected[text] = set()
        return self.selected[text]
