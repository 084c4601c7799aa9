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

    `heads[s - first]` is the text of second s: the hot loops read it directly, `text`
    goes anywhere. Each second is formatted the first time it is asked for: formatting
    every second from the incident's start to now took half a minute for an incident
    300 days old, of which a few thousand seconds are used."""

    def __init__(self, first_us: int) -> None:
        self.first = first_us // US
        self.heads = _Heads(self.first)
        # The fraction's six digits, looked up rather than formatted: ten million rows
        # have thirty million timestamps.
        self.micros = [f"{micro:06d}" for micro in range(US)]

    def text(self, us: int) -> str:
        """`us` as COPY text of a timestamptz."""
        seconds, micro = divmod(us, US)
        return f"{self.heads[seconds - self.first]}.{micro:06d}+00"


class _Heads(dict):
    """{offset: the text of second `first + offset`}, each made when first read."""

    def __init__(self, first: int) -> None:
        super().__init__()
        self.first = first

    def __missing__(self, offset: int) -> str:
        text = self[offset] = _head(self.first + offset)
        return text


def _head(second: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(second))
