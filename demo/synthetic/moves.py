"""What the incident's senders send: the kinds of event, who sends each, to whom, and
when in the incident it happens.

Most of the traffic the receivers accept: the national system's commands, the
Northwest controllers' worm alerts. The rest their policies refuse: alerts below the
threat level they accept, controllers of other regions, the rogue controller.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass

from demo.scenario import VULNERABLE, WORM_ALERT

NATIONAL = "intellimune-national"
NORTHWEST = "northwest-controller"
ROGUE = "rogue-controller"
OPERATOR = "olivia"  # the console operator who sends for the national system
VULNERABLE_IIS = 'software == "IIS" and version ~ "2.4.*"'
# A narrower audience: a region, then one software, then one version of it.
NARROWING = ("region", "software", "version")
NARROWNESS_WEIGHTS = (4, 3, 2, 1)  # of adding 0, 1, 2 or 3 of NARROWING
NATIONAL_BY_OPERATOR = 0.4  # share of the national system's sends made from the console


@dataclass(frozen=True)
class Send:
    """One event as its sender (or an operator acting for it) asked for it."""

    sender: str
    content: dict
    selector: str
    lifetime_s: int
    channel: str
    operator: str | None = None

    @property
    def sent_by(self) -> str:
        """The audit actor who published it."""
        return f"user:{self.operator}" if self.operator else f"client:{self.sender}"

    @property
    def action(self) -> str:
        """What it asks or says, for its receivers' answers: a command's action, the
        kind otherwise."""
        return self.content.get("action") or self.content["kind"]


@dataclass(frozen=True)
class Cast:
    """Who may send what: sender names by role, and example receiver attributes to
    narrow selectors with (real values of the fleet)."""

    northwest: list[str]  # regional controllers of the Northwest
    regional: dict[str, list[str]]  # other regions' controllers, by region
    profiles: list[dict]
    weights: list[int]  # how many receivers have each profile

    def profile(self, rng: random.Random) -> dict:
        return rng.choices(self.profiles, weights=self.weights)[0]


Make = Callable[[random.Random, Cast, int], Send]


@dataclass(frozen=True)
class Move:
    """A kind of send: its share of the traffic while it happens (`weight`), and when
    it happens, as fractions of the incident."""

    name: str
    weight: int
    window: tuple[float, float]
    make: Make

    def happens_at(self, fraction: float) -> bool:
        return self.window[0] <= fraction < self.window[1]


def narrowed(selector: str, cast: Cast, rng: random.Random, narrowness: int) -> str:
    """`selector`, further limited to `narrowness` attributes of one real receiver."""
    profile = cast.profile(rng)
    clauses = [selector] if selector else []
    for name in NARROWING[:narrowness]:
        if name in profile and name not in selector:
            clauses.append(f"{name} == {json.dumps(profile[name])}")
    return " and ".join(clauses)


def _national(content: dict, selector: str, lifetime_s: int, rng: random.Random) -> Send:
    operator = OPERATOR if rng.random() < NATIONAL_BY_OPERATOR else None
    return Send(NATIONAL, content, selector, lifetime_s, "commands", operator)


def worm_alert(rng: random.Random, cast: Cast, narrowness: int) -> Send:
    selector = narrowed('region == "Northwest"', cast, rng, narrowness)
    content = {**WORM_ALERT, "threat_level": rng.choice((4, 4, 4, 5))}
    lifetime = rng.choice((600, 1200, 1800, 3600))
    return Send(rng.choice(cast.northwest), content, selector, lifetime, "alerts")


def disable_cgi(rng: random.Random, cast: Cast, narrowness: int) -> Send:
    selector = narrowed(VULNERABLE, cast, rng, narrowness)
    content = {"kind": "command", "action": "disable-cgi"}
    return _national(content, selector, rng.choice((300, 600, 900)), rng)


def shutdown(rng: random.Random, cast: Cast, narrowness: int) -> Send:
    selector = narrowed(VULNERABLE_IIS, cast, rng, narrowness)
    return _national({"kind": "command", "action": "shutdown"}, selector, 600, rng)


def patch(rng: random.Random, cast: Cast, narrowness: int) -> Send:
    selector = narrowed(VULNERABLE_IIS, cast, rng, narrowness)
    content = {"kind": "command", "action": "patch", "target": "IIS", "version": "2.4.9"}
    return _national(content, selector, rng.choice((1800, 3600)), rng)


def status(rng: random.Random, cast: Cast, narrowness: int) -> Send:
    selector = narrowed("", cast, rng, narrowness)
    return _national({"kind": "command", "action": "status"}, selector, rng.choice((60, 120)), rng)


def report(rng: random.Random, cast: Cast, narrowness: int) -> Send:
    """The national system's situation report: only receivers whose policy was widened
    to take reports accept it."""
    selector = narrowed("", cast, rng, narrowness)
    content = {"kind": "report", "summary": f"worm containment at {rng.randint(40, 99)}%"}
    return Send(NATIONAL, content, selector, 3600, "reports")


ACCEPTED = (
    Move("worm-alert", 3, (0.0, 0.7), worm_alert),
    Move("disable-cgi", 4, (0.02, 0.5), disable_cgi),
    Move("shutdown", 2, (0.1, 0.6), shutdown),
    Move("patch", 4, (0.4, 1.0), patch),
    Move("status", 3, (0.0, 1.0), status),
    Move("report", 1, (0.3, 1.0), report),
)
RESENT = frozenset({"disable-cgi", "shutdown", "patch"})  # commands that want an answer


def first_alert() -> Send:
    """The scenario's first move: the Northwest controller warns its region."""
    return Send(NORTHWEST, dict(WORM_ALERT), 'region == "Northwest"', 600, "alerts")


def scan_alert(rng: random.Random, cast: Cast, narrowness: int) -> Send:
    """Below the threat level the servers accept: filtered by content."""
    content = {**WORM_ALERT, "alert": "scan", "threat_level": 3}
    return Send(rng.choice(cast.northwest), content, 'region == "Northwest"', 600, "alerts")


def foreign_alert(rng: random.Random, cast: Cast, narrowness: int) -> Send:
    """Another region's controller: the servers take alerts from the Northwest only."""
    region = rng.choice(sorted(cast.regional))
    sender = rng.choice(cast.regional[region])
    selector = f"region == {json.dumps(region)}"
    return Send(sender, {**WORM_ALERT, "threat_level": 4}, selector, 900, "alerts")


def regional_command(rng: random.Random, cast: Cast, narrowness: int) -> Send:
    """A regional controller giving a command: only the national system may."""
    senders = [name for names in cast.regional.values() for name in names] + cast.northwest
    content = {"kind": "command", "action": "status"}
    return Send(rng.choice(senders), content, narrowed("", cast, rng, 1), 120, "commands")


def rogue_alert(rng: random.Random, cast: Cast, narrowness: int) -> Send:
    """The trust-1 controller: refused by every server's policy."""
    content = {**WORM_ALERT, "threat_level": 5}
    return Send(ROGUE, content, 'region == "Northwest"', 600, "alerts")


REFUSED = (
    Move("scan-alert", 2, (0.0, 1.0), scan_alert),
    Move("foreign-alert", 2, (0.0, 1.0), foreign_alert),
    Move("regional-command", 1, (0.0, 1.0), regional_command),
)
ROGUE_MOVE = Move("rogue-alert", 1, (0.0, 1.0), rogue_alert)


def pick(moves: tuple[Move, ...], fraction: float, rng: random.Random) -> Move | None:
    """One of the moves that happen at `fraction` of the incident, by weight."""
    open_moves = [move for move in moves if move.happens_at(fraction)]
    if not open_moves:
        return None
    return rng.choices(open_moves, weights=[move.weight for move in open_moves])[0]
