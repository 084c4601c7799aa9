"""Receivers' policies during the incident: verdicts of a policy on a sender and a
content (with the category of a refusal, as the leaves decide it), and the policy
changes the incident makes.

Before the incident a policy author quarantined a group of servers (their policy
refuses every sender: the audit report's `policy_refuses_all`); during it, she widens
the Northeast's policy to take the national system's situation reports.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from broker.audit import policy_refusal_category
from broker.services.policies import canonical_policy
from broker.vocabulary import Vocabulary
from demo.scenario import WEB_SERVER_POLICY
from demo.synthetic.clock import MINUTE
from demo.synthetic.incident import Incident
from demo.synthetic.roster import Group

POLICY_AUTHOR = "user:paula"
# Servers the scenario's own sends never address (not the Northwest, not IIS), so that
# the demo's worm alert and commands reach whom docs/scenario.md says.
QUARANTINE = (
    'region == "Southwest" and software == "nginx"',
    "# Quarantined while the worm is investigated: nothing gets through\naccept false\n",
)
QUARANTINED_BEFORE = 60 * MINUTE  # the incident's start
REPORTS = (
    'region == "Northeast"',
    WEB_SERVER_POLICY.rstrip()
    + '\n or (event.kind == "report" and sender.organization == "Intellimune")\n',
)


class Judge:
    """Policies' verdicts on (sender attributes, content), computed once for each
    distinct policy, sender and content: None when the policy accepts, else the
    refusal's category (broker.audit.policy_refusal_category, as a leaf decides it)."""

    def __init__(self, words: Vocabulary) -> None:
        self.words = words
        self._verdicts: dict[tuple, str | None] = {}

    def verdict(self, policy: str, sender: dict, content: dict, keys: tuple[str, str]):
        """The verdict; `keys` are the sender's and the content's JSON, sorted (made
        once by the caller for all the groups it asks about)."""
        key = (policy, *keys)
        if key not in self._verdicts:
            parsed = self.words.stored_policy(policy)
            accepts = parsed.accepts(sender, content)
            verdict = None if accepts else policy_refusal_category(parsed.filters(), sender)
            self._verdicts[key] = verdict
        return self._verdicts[key]


@dataclass
class PolicyChange:
    """One policy saved for a selection of receivers at `at`."""

    at: int
    selection: str
    text: str
    groups: set[int] = field(default_factory=set)
    canonical: str = ""


def plan_policy_changes(incident: Incident, groups: list[Group], words: Vocabulary):
    """The incident's policy changes, in time order, each with the groups it selects;
    a change that selects nobody in this fleet is left out."""
    planned = [
        PolicyChange(incident.start - QUARANTINED_BEFORE, *QUARANTINE),
        PolicyChange(incident.at(0.25), *REPORTS),
    ]
    for change in planned:
        selector = words.selector(change.selection)
        change.groups = {g.index for g in groups if selector.selects(g.attributes)}
        change.canonical = canonical_policy(change.text)
    return [change for change in planned if change.groups]


class PolicyTimeline:
    """Which policy each group holds at a moment."""

    def __init__(self, groups: list[Group], changes: list[PolicyChange]) -> None:
        self.groups = groups
        self.changes = changes

    def policy_at(self, group: Group, moment: int) -> str:
        policy = group.policy
        for change in self.changes:
            if change.at <= moment and group.index in change.groups:
                policy = change.canonical
        return policy
