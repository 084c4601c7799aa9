"""A report page's filters as its query states them: the time window (`from`, `to`, UTC;
or a `preset` ending now) and the region (`region`, empty for every region).

The same filters choose which run a page shows (exactly these) and what "Run with
these filters" asks for, so they are read in one place.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from datetime import UTC, datetime, timedelta

from django.utils import timezone

from broker.errors import InvalidInput
from broker.reads.audit import parse_moment
from reports.results import Params

# The windows offered as one click, ending now (to the minute).
PRESETS = {
    "1h": ("last hour", timedelta(hours=1)),
    "6h": ("6 hours", timedelta(hours=6)),
    "24h": ("24 hours", timedelta(hours=24)),
    "7d": ("7 days", timedelta(days=7)),
}
DEFAULT_PRESET = "24h"
MOMENT_FORMAT = "%Y-%m-%dT%H:%M:%S"  # as datetime-local fields write it, in UTC


def preset_window(preset: str, *, now: datetime | None = None) -> Params:
    """The window of `preset` ending now (cut to the minute, so that a page opened
    twice in the same minute asks for the same run)."""
    if preset not in PRESETS:
        choices = ", ".join(PRESETS)
        raise InvalidInput(f"preset must be one of {choices}, not {preset[:20]!r}", field="preset")
    end = (now or timezone.now()).replace(second=0, microsecond=0) + timedelta(minutes=1)
    return Params(window_start=end - PRESETS[preset][1], window_end=end)


def parse_filters(params: Mapping[str, str], *, regions: Collection[str]) -> Params:
    """The window and region `params` state; InvalidInput naming the field (`from`,
    `to` or `region`) when one cannot be read or is not one of `regions`."""
    start = _moment(params, "from")
    end = _moment(params, "to")
    if end <= start:
        raise InvalidInput("to must be later than from", field="to")
    region = params.get("region", "").strip()
    if region and region not in regions:
        raise InvalidInput(
            f"region: no client is in region {region[:60]!r}; choose one from the list",
            field="region",
        )
    return Params(window_start=start, window_end=end, region=region)


def _moment(params: Mapping[str, str], name: str) -> datetime:
    parsed = parse_moment(params.get(name, ""), field=name)
    if parsed is None:
        raise InvalidInput(f"{name} is needed: a date and time, UTC", field=name)
    return parsed[0]


def query_of(params: Params) -> dict[str, str]:
    """The page's query for `params`: what its links, its form and its URL state."""
    query = {"from": moment_text(params.window_start), "to": moment_text(params.window_end)}
    if params.region:
        query["region"] = params.region
    return query


def moment_text(moment: datetime) -> str:
    """A moment as the filters' fields write it: to the second, UTC."""
    return moment.astimezone(UTC).strftime(MOMENT_FORMAT)
