"""Moments as whole microseconds since the epoch (UTC): cheap to add and compare by
the million, turned into text for COPY with a cache of seconds."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

US = 1_000_000
MS = 1_000
MINUTE = 60 * US
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def to_us(moment: datetime) -> int:
    """`moment` (aware) in microseconds since the epoch."""
    return (moment - EPOCH) // timedelta(microseconds=1)


def to_datetime(us: int) -> datetime:
    """The aware UTC datetime of `us`."""
    return EPOCH + timedelta(microseconds=us)


class Stamps:
    """timestamptz text of moments, the seconds' part formatted once each (an
    incident spans a few thousand seconds; its deliveries are millions).

    `heads[s - first]` is the text of second s from `first` to `last`: the hot loops
    read it directly, `text` goes anywhere."""

    def __init__(self, first_us: int, last_us: int) -> None:
        self.first = first_us // US
        self.heads = [_head(second) for second in range(self.first, last_us // US + 1)]
        # The fraction's six digits, looked up rather than formatted: ten million rows
        # have thirty million timestamps.
        self.micros = [f"{micro:06d}" for micro in range(US)]

    def text(self, us: int) -> str:
        """`us` as COPY text of a timestamptz."""
        seconds, micro = divmod(us, US)
        index = seconds - self.first
        head = self.heads[index] if 0 <= index < len(self.heads) else _head(seconds)
        return f"{head}.{micro:06d}+00"


def _head(second: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(second))
