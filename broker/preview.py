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

from broker.directory import Directory, fresh_directory
from broker.models import Event, PolicyVersion
from broker.selectors import search_vocabulary, vocabulary
from policies import Policy, PolicySyntaxError

RECENT_EVENTS = 500
RECENT_WINDOW = timedelta(days=7)
NO_POLICY = "accept nothing (no policy yet)"


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
    groups = current_policy_groups(client_ids)
    effect = PolicyEffect(considered=len(events))
    with fresh_directory() as directory:
        addressed = _Addressed(directory)
        for event in events:
            accepted, refused = _event_change(addressed(event), event, groups, new)
            if accepted:
                effect.newly_accepted.append(EventChange(event, accepted))
            if refused:
                effect.newly_refused.append(EventChange(event, refused))
    return effect


def _recent_events() -> list[Event]:
    since = timezone.now() - RECENT_WINDOW
    query = Event.objects.filter(published_at__gte=since).select_related("sender")
    return list(query.order_by("-published_at")[:RECENT_EVENTS])


def current_policy_groups(client_ids: set[int]) -> dict[str, set[int]]:
    """{current canonical policy text (or NO_POLICY): its receivers among client_ids}."""
    newest = (
        PolicyVersion.objects.filter(client_id__in=client_ids)
        .order_by("client_id", "-version")
        .distinct("client_id")
        .values_list("client_id", "canonical_text")
    )
    groups: dict[str, set[int]] = defaultdict(set)
    for client_id, text in newest:
        groups[text].add(client_id)
    without = client_ids - set().union(*groups.values()) if groups else set(client_ids)
    if without:
        groups[NO_POLICY] = without
    return groups


def _event_change(
    addressed: set[int] | None, event: Event, groups: dict[str, set[int]], new: Policy
) -> tuple[int, int]:
    """(receivers newly accepting, receivers newly refusing) `event`, of those its
    selector `addressed` (None: all)."""
    now_accepts = new.accepts(event.sender_attributes, event.content)
    accepted = refused = 0
    for text, members in groups.items():
        old = _stored(text)
        if old is not None and old.accepts(event.sender_attributes, event.content) == now_accepts:
            continue
        if old is None and not now_accepts:
            continue
        count = len(members) if addressed is None else len(members & addressed)
        if now_accepts:
            accepted += count
        else:
            refused += count
    return accepted, refused


class _Addressed:
    """The clients an event's selector addresses (None: everyone), once per selector:
    recent events mostly repeat a few selectors."""

    def __init__(self, directory: Directory) -> None:
        self.directory = directory
        self.known: dict[str, set[int] | None] = {}

    def __call__(self, event: Event) -> set[int] | None:
        text = event.selector.strip()
        if text not in self.known:
            self.known[text] = self._select(text)
        return self.known[text]

    def _select(self, text: str) -> set[int] | None:
        if not text:
            return None
        try:
            return self.directory.select(search_vocabulary().selector(text))
        except PolicySyntaxError:  # no longer types: it addresses no one now
            return set()


def _stored(text: str) -> Policy | None:
    return None if text == NO_POLICY else vocabulary().stored_policy(text)
