"""Whom an event would reach before it is sent, from both sides: the receivers its
selector addresses, and which of those would refuse its sender or content under their
own policies, and why (the failing clauses), by region and by model.

It reads the console's directory (broker.reads.directory), which selects exactly as the
leaves do; acceptance depends only on the sender's attested attributes and the content,
so each distinct policy among the addressed receivers is checked once.
"""

from __future__ import annotations

import heapq
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from sn_agent.client import ACTS_ON_ANYTHING, ACTS_ON_NOTHING, ACTS_ON_SIGNED

from broker.models import Client
from broker.reads.clients import attested_attributes
from broker.reads.directory import Directory, fresh_directory
from broker.vocabulary import vocabulary
from policies import Selector
from policies.explain import Verdict, check_policy

EXAMPLES_PER_REASON = 5
NO_POLICY_REASON = "it has no policy yet, so it accepts nothing"
REGION = "region"
NO_REGION = "(no region)"
# The send preview's words for agents, by what they act on (AgentPresence.acts_on).
AGENTS_THAT = {
    ACTS_ON_SIGNED: "verify signatures",
    ACTS_ON_ANYTHING: "act on anything unsigned",
    ACTS_ON_NOTHING: "run no action (no [trust])",
    "": "of unknown kind",
}


@dataclass(frozen=True)
class Refusal:
    """Addressed receivers that would refuse, for one reason."""

    reason: str
    policy: str | None  # the canonical policy that refuses (None: no policy yet)
    verdict: Verdict | None
    count: int
    examples: list[str]


@dataclass
class Breakdown:
    """Addressed and accepting receivers sharing one region, or one model."""

    value: str
    addressed: int = 0
    accepting: int = 0

    @property
    def refusing(self) -> int:
        return self.addressed - self.accepting


@dataclass
class Reach:
    """What sending would do now: addressed, accepting, the refusals and where."""

    sender_attributes: dict[str, Any]
    addressed: int = 0
    accepting: int = 0
    refusals: list[Refusal] = field(default_factory=list)
    by_region: list[Breakdown] = field(default_factory=list)
    by_model: list[Breakdown] = field(default_factory=list)
    refusing_names: list[str] = field(default_factory=list)
    # Those accepting, by what their agents act on (AgentPresence.acts_on; "": unknown):
    # an unsigned event is refused by every agent that acts only on signed ones.
    acts_on: Counter = field(default_factory=Counter)

    @property
    def refusing(self) -> int:
        return self.addressed - self.accepting

    @property
    def verifying(self) -> int:
        """Accepting receivers whose agents act only on signed events."""
        return self.acts_on[ACTS_ON_SIGNED]

    @property
    def acts_on_labels(self) -> list[tuple[str, int]]:
        """(what their agents act on, in words; how many), for those accepting."""
        counts = self.acts_on
        return [(words, counts[kind]) for kind, words in AGENTS_THAT.items() if counts[kind]]


def reach_of(
    *,
    sender: Client,
    content: dict[str, Any],
    selector: Selector | None,
    within: list[int] | None = None,
) -> Reach:
    """The two-sided preview of `sender` publishing `content` to `selector` now
    (limited to the clients `within`, for a resend)."""
    reach = Reach(sender_attributes=attested_attributes(sender))
    with fresh_directory() as directory:
        addressed = _addressable(directory, directory.select(selector))
        if within is not None:
            addressed &= set(within)
        accepting: set[int] = set()
        for text, members in directory.policy_groups(addressed).items():
            verdict = _verdict(text, reach.sender_attributes, content)
            if verdict is not None and verdict.holds:
                accepting |= members
            else:
                reach.refusals.append(_refusal(directory, text, verdict, members))
        _count(reach, directory, addressed, accepting)
    reach.refusals.sort(key=lambda refusal: (-refusal.count, refusal.reason))
    return reach


def refusing_unsigned(
    *, sender: Client, content: dict[str, Any], selector: Selector | None
) -> tuple[int, int]:
    """(how many receivers the event reaches, how many of them act only on signed
    events): those refuse it if it goes unsigned."""
    reach = reach_of(sender=sender, content=content, selector=selector)
    return reach.accepting, reach.verifying


def _addressable(directory: Directory, ids: set[int]) -> set[int]:
    """Those of `ids` that can receive at all: active receivers."""
    entries = directory.entries
    return {i for i in ids if entries[i].can_receive and entries[i].is_active}


def _verdict(text: str | None, sender_attributes: dict, content: dict) -> Verdict | None:
    if text is None:
        return None
    return check_policy(vocabulary().stored_policy(text), sender_attributes, content)


def _refusal(
    directory: Directory, text: str | None, verdict: Verdict | None, members: set[int]
) -> Refusal:
    # A few examples: the first names, without sorting every refusing receiver's.
    names = heapq.nsmallest(EXAMPLES_PER_REASON, (directory.entries[i].name for i in members))
    reason = NO_POLICY_REASON if verdict is None else verdict.reason
    return Refusal(reason, text, verdict, len(members), names)


def _count(reach: Reach, directory: Directory, addressed: set[int], accepting: set[int]) -> None:
    reach.addressed, reach.accepting = len(addressed), len(accepting)
    refusing = addressed - accepting  # usually far fewer than those accepting
    # Counted from the region's column and the entries, never one receiver's whole
    # attributes at a time: the preview of a send to everyone counts 100,000.
    reach.by_region = _breakdowns(
        directory.value_counts(REGION, addressed), directory.value_counts(REGION, refusing)
    )
    entries = directory.entries
    reach.by_model = _breakdowns(
        directory.model_counts(addressed), directory.model_counts(refusing)
    )
    reach.refusing_names = sorted(entries[i].name for i in refusing)
    reach.acts_on = Counter(directory.acts_on(i) for i in accepting)


def _breakdowns(addressed: Counter, refusing: Counter) -> list[Breakdown]:
    """Rows by value (None: NO_REGION), sorted by value."""
    rows: dict[str, Breakdown] = {}
    for value, count in addressed.items():
        row = rows.setdefault(str(value or NO_REGION), Breakdown(str(value or NO_REGION)))
        row.addressed += count
        row.accepting += count - refusing.get(value, 0)
    return sorted(rows.values(), key=lambda row: row.value)
