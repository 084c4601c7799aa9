"""The incident's events: refused traffic first, then accepted sends drawn until
their deliveries reach the size asked, with resends to those who did not answer."""

from __future__ import annotations

import json
import random
import uuid
from dataclasses import dataclass, field, replace

from broker.vocabulary import Vocabulary
from demo.synthetic.changes import AttributeChange, attributes_at
from demo.synthetic.clock import MINUTE, US
from demo.synthetic.incident import LAST_HALF_HOUR, Fate, Incident
from demo.synthetic.moves import (
    ACCEPTED,
    OPERATOR,
    REFUSED,
    RESENT,
    ROGUE_MOVE,
    Cast,
    Send,
    first_alert,
    pick,
)
from demo.synthetic.policies import Judge, PolicyTimeline
from demo.synthetic.roster import Fleet, Sender
from demo.synthetic.routing import Audience, Route

ATTEMPTS = 40  # draws to find a send that fits what is left of the size asked
RESENDS = 0.3  # share of commands resent to those who did not answer
ROGUE_SURGE = 8  # how much more often the rogue controller sends in the last half hour
SAMPLED = 30  # draws that estimate an accepted send's deliveries


class NothingToDeliver(Exception):
    """No receiver of this fleet accepts any of the incident's sends."""


@dataclass
class Planned:
    """An event to write, with whom it reaches and (once routed) its hops."""

    send: Send
    sender: Sender
    at: int  # published, in microseconds
    sender_attributes: dict
    audience: Audience
    resend_of: Planned | None = None
    id: uuid.UUID = field(default_factory=uuid.uuid4)
    sequence: int = 0
    route: Route | None = None

    @property
    def expires_at(self) -> int:
        return self.at + self.send.lifetime_s * US

    @property
    def routed_at(self) -> int:
        return self.route.routed_at

    @property
    def sender_actor(self) -> str:
        """Who the tree's refusals name: the sender, whoever sent for it."""
        return f"client:{self.sender.name}"

    @property
    def target(self) -> str:
        return f"event:{self.id}"


@dataclass
class World:
    """Everything a send is judged against."""

    incident: Incident
    fleet: Fleet
    senders: dict[str, Sender]
    cast: Cast
    words: Vocabulary
    policies: PolicyTimeline
    attribute_changes: list[AttributeChange]
    fates: dict[int, Fate]


class Planner:
    """Plans sends into events with their audiences."""

    def __init__(self, world: World, rng: random.Random) -> None:
        self.world = world
        self.rng = rng
        self.judge = Judge(world.words)
        self._selected: dict[str, list[int]] = {}
        self.troubled = [r for r in world.fleet.receivers if r.id in world.fates]

    def plan(self, send: Send, at: int, recipients=None, resend_of=None) -> Planned:
        """The event `send` makes at `at` (limited to `recipients`, for a resend)."""
        sender = self.world.senders[send.sender]
        attributes = attributes_at(sender, self.world.attribute_changes, at)
        sender_key, content_key = (
            json.dumps(attributes, sort_keys=True),
            json.dumps(send.content, sort_keys=True),
        )
        groups = self.world.fleet.groups
        verdicts = {
            index: self.judge.verdict(self.world.policies.policy_at(groups[index], at),
                                      attributes, send.content, (sender_key, content_key))
            for index in self._selected_groups(send.selector)
        }  # fmt: skip
        audience = Audience.of(verdicts, self.world.fleet, recipients)
        return Planned(send, sender, at, attributes, audience, resend_of)

    def _selected_groups(self, selector: str) -> list[int]:
        if selector not in self._selected:
            groups = self.world.fleet.groups
            parsed = self.world.words.selector(selector) if selector else None
            self._selected[selector] = [
                g.index for g in groups if parsed is None or parsed.selects(g.attributes)
            ]
        return self._selected[selector]

    def draw(self, left: int) -> Planned:
        """An accepted send that makes at most `left` deliveries if one is found, else
        the one that makes fewest (the size asked is met, a little over)."""
        best = None
        for attempt in range(ATTEMPTS):
            fraction = self.rng.random()
            move = pick(ACCEPTED, fraction, self.rng)
            narrowness = self._narrowness(attempt)
            event = self.plan(
                move.make(self.rng, self.world.cast, narrowness), self.world.incident.at(fraction)
            )
            count = event.audience.count
            if 0 < count <= left:
                return event
            if count and (best is None or count < best.audience.count):
                best = event
        if best is None:
            raise NothingToDeliver("no receiver accepts any of the incident's sends")
        return best

    def _narrowness(self, attempt: int) -> int:
        """Mostly wide sends; narrower as draws fail to fit what is left."""
        if attempt < ATTEMPTS // 4:
            return self.rng.choices(range(4), weights=(4, 3, 2, 1))[0]
        return min(3, 1 + attempt * 4 // ATTEMPTS)

    def resend(self, event: Planned, *, surely: bool = False) -> Planned | None:
        """Now and then (`surely`: if it can), an operator resends a command to its
        receivers that have not answered it a few minutes after it expired."""
        if event.send.action not in RESENT or not (surely or self.rng.random() < RESENDS):
            return None
        at = event.expires_at + self.rng.randint(1, 8) * MINUTE
        if at >= self.world.incident.end:
            return None
        group_of, fates = self.world.fleet.group_of, self.world.fates
        waiting = [
            r for r in self.troubled
            if event.audience.accepts(group_of[r.id]) and fates[r.id].unanswered(event.at, at)
        ]  # fmt: skip
        if not waiting:
            return None
        send = replace(event.send, operator=OPERATOR)
        return self.plan(send, at, recipients=waiting, resend_of=event)

    def mean_deliveries(self) -> float:
        """What an accepted send delivers, on average (to size the refused traffic)."""
        counts = [self.draw(10**12).audience.count for _ in range(SAMPLED)]
        return sum(counts) / len(counts)


def plan_events(planner: Planner, deliveries: int) -> list[Planned]:
    """The incident's events in time order, making `deliveries` deliveries (a little
    more: the last send rarely fits exactly)."""
    incident = planner.world.incident
    expected = max(1, round(deliveries / planner.mean_deliveries()))
    events = refused_traffic(planner, expected)
    total = sum(event.audience.count for event in events)
    first = planner.plan(first_alert(), incident.start + 20 * US)
    if first.audience.count <= deliveries - total:  # a small incident over a large fleet
        events.append(first)
        total += first.audience.count
    while total < deliveries:
        event = planner.draw(deliveries - total)
        events.append(event)
        total += event.audience.count
        resent = planner.resend(event)
        if resent is not None:
            events.append(resent)
            total += resent.audience.count
    if not any(event.resend_of for event in events):
        events += _one_resend(planner, events)
    events.sort(key=lambda event: event.at)
    return events


def _one_resend(planner: Planner, events: list[Planned]) -> list[Planned]:
    """The resend of the command most left unanswered, if any was: every incident has
    its operator chasing the silent servers (a few more deliveries than asked)."""
    resends = [planner.resend(event, surely=True) for event in events]
    resends = [resend for resend in resends if resend is not None]
    return [max(resends, key=lambda resend: resend.audience.count)] if resends else []


def refused_traffic(planner: Planner, expected: int) -> list[Planned]:
    """Sends the receivers' policies refuse, about a quarter as many as the accepted
    ones; the rogue controller's grow eightfold in the incident's last half hour."""
    rng, incident, cast = planner.rng, planner.world.incident, planner.world.cast
    moves = tuple(m for m in REFUSED if m.name != "foreign-alert" or cast.regional)
    events = []
    for _ in range(max(3, expected // 4)):
        fraction = rng.random()
        move = pick(moves, fraction, rng)
        events.append(planner.plan(move.make(rng, cast, 0), incident.at(fraction)))
    events += _rogue_traffic(planner, max(3, expected // 40))
    return events


def _rogue_traffic(planner: Planner, early: int) -> list[Planned]:
    """The rogue controller's alerts: `early` spread evenly before the incident's last
    half hour, ROGUE_SURGE times as often in it (the audit report's refusals jump)."""
    incident, rng = planner.world.incident, planner.rng
    surge_from = max(incident.start, incident.end - LAST_HALF_HOUR)
    rate = early / max(1, surge_from - incident.start)
    late = max(6, round(rate * ROGUE_SURGE * (incident.end - surge_from)))
    moments = _spread(early, incident.start, surge_from, rng)
    moments += _spread(late, surge_from, incident.end, rng)
    return [planner.plan(ROGUE_MOVE.make(rng, planner.world.cast, 0), at) for at in moments]


def _spread(count: int, begin: int, end: int, rng: random.Random) -> list[int]:
    """`count` moments between `begin` and `end`, one at random in each of `count`
    equal slots (evenly spread, not evenly spaced)."""
    slot = (end - begin) / max(1, count)
    return [begin + int(slot * (number + rng.random())) for number in range(count)]
