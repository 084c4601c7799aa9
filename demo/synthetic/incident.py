"""When the incident happens and how each receiver behaves during it.

Receivers differ by region: one region is slow to confirm and answer, and more of its
servers fall silent (the review should find it). A few servers in every region go
offline for a while or for good, and a few hang: they confirm what they receive and
never answer again.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from datetime import datetime

from demo.synthetic.clock import MINUTE, US, to_us

SPAN = 120 * MINUTE  # how long the incident lasts, unless it began less long ago
LAST_HALF_HOUR = 30 * MINUTE


@dataclass(frozen=True)
class Behaviour:
    """How a region's servers behave: factors on confirmation and answer delays, the
    share that fall silent, and a factor on how often commands fail."""

    confirm: float
    answer: float
    silent: float
    failing: float


STEADY = Behaviour(confirm=1.0, answer=1.0, silent=0.02, failing=1.0)
BEHAVIOURS = {
    "Northwest": Behaviour(confirm=1.0, answer=1.0, silent=0.03, failing=1.0),
    "Northeast": STEADY,
    "Southwest": Behaviour(confirm=1.4, answer=1.3, silent=0.04, failing=1.2),
    # The region the review should single out: slow links, many silent servers.
    "Southeast": Behaviour(confirm=4.0, answer=3.0, silent=0.2, failing=2.5),
}
HANGING = 0.01  # share of servers whose agent hangs at some moment
COMING_BACK = 0.4  # share of silent servers that come back before the end


@dataclass(frozen=True)
class Fate:
    """What goes wrong with one receiver, in microseconds: offline from `off` until
    `back` (None: still offline), or hung from `hung` (confirms, never answers)."""

    off: int | None = None
    back: int | None = None
    hung: int | None = None

    def offline_at(self, moment: int) -> bool:
        return self.off is not None and self.off <= moment and (self.back or math.inf) > moment

    def unanswered(self, delivered: int, by: int) -> bool:
        """Whether a delivery made at `delivered` is still unanswered at `by`."""
        if self.hung is not None and self.hung <= delivered:
            return True
        return self.offline_at(delivered) and (self.back or math.inf) > by


@dataclass(frozen=True)
class Incident:
    """The incident's window and the present, in microseconds."""

    start: int
    end: int
    now: int

    @classmethod
    def beginning(cls, start: datetime, now: datetime) -> Incident:
        start_us, now_us = to_us(start), to_us(now)
        # Nothing is published in the future: a recent start gives a shorter incident.
        return cls(start_us, min(start_us + SPAN, now_us - MINUTE), now_us)

    @property
    def span(self) -> int:
        return self.end - self.start

    def at(self, fraction: float) -> int:
        """The moment `fraction` of the way through the incident."""
        return self.start + round(fraction * self.span)

    def fates(self, regions: dict[str | None, list[int]], rng: random.Random) -> dict[int, Fate]:
        """What goes wrong, by receiver id, for receivers by region: in each region
        exactly its share of silent servers and of hanging ones, drawn at random."""
        fates = {}
        for region, ids in sorted(regions.items(), key=lambda item: str(item[0])):
            pace = behaviour(region)
            # Rounded up: a small fleet's regions have one of each too.
            silent, hanging = math.ceil(len(ids) * pace.silent), math.ceil(len(ids) * HANGING)
            for number, receiver in enumerate(rng.sample(ids, min(len(ids), silent + hanging))):
                fates[receiver] = self._silence(rng) if number < silent else self._hang(rng)
        return fates

    def _silence(self, rng: random.Random) -> Fate:
        off = self.at(rng.uniform(-0.1, 0.95))
        back = off + round(rng.lognormvariate(math.log(15 * 60), 0.6) * US)
        return Fate(off=off, back=back if rng.random() < COMING_BACK else None)

    def _hang(self, rng: random.Random) -> Fate:
        return Fate(hung=self.at(rng.random()))


def behaviour(region: str | None) -> Behaviour:
    """How the servers of `region` behave (any other region: steadily)."""
    return BEHAVIOURS.get(region, STEADY)
