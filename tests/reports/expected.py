"""What the reports should say, worked out independently of Spark: in plain Python over
the ORM's rows, as the event page and the tree would count them."""

from __future__ import annotations

import math
from collections import defaultdict
from datetime import UTC, datetime, timedelta

from broker.models import AttributeValue, Client, Delivery, Dispatcher, Event
from reports.results import Params

NO_REGION = "(no region)"


def iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def micros(delta: timedelta) -> int:
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def regions() -> dict[int, str]:
    """Each client's region (its live `region` value), NO_REGION without one."""
    values = AttributeValue.objects.filter(name="region", revoked_at__isnull=True)
    found = dict(values.values_list("client_id", "value"))
    return {pk: found.get(pk, NO_REGION) for pk in Client.objects.values_list("pk", flat=True)}


def window_events(params: Params) -> list[Event]:
    events = Event.objects.filter(
        published_at__gte=params.window_start, published_at__lt=params.window_end
    ).select_related("sender")
    return sorted(events, key=lambda event: (event.published_at, str(event.pk)))


def deliveries(params: Params) -> list[Delivery]:
    """The window's deliveries to the run's receivers (the region's, if one)."""
    region_of = regions()
    rows = Delivery.objects.filter(event__in=window_events(params)).select_related(
        "event", "receiver"
    )
    return [d for d in rows if not params.region or region_of[d.receiver_id] == params.region]


def tally(rows: list[Delivery]) -> dict:
    """Counts as the event page makes them (broker.reads.progress.Tally)."""
    states = [row.state for row in rows]
    return {
        "targeted": len(states),
        "delivered": sum(s in ("delivered", "acked", "failed") for s in states),
        "acked_ok": states.count("acked"),
        "failed": states.count("failed"),
        "no_answer": sum(s in ("pending", "delivered") for s in states),
        "expired": states.count("expired"),
    }


def times_to_acknowledge(rows: list[Delivery]) -> dict:
    """Seconds from publishing to the acknowledgement that brought acknowledged-ok to
    50, 90, 99 % of those targeted (None if it never did)."""
    delays = sorted(micros(r.acked_at - r.event.published_at) for r in rows if r.state == "acked")
    times = {}
    for percent in (50, 90, 99):
        k = math.ceil(percent * len(rows) / 100)
        times[f"t{percent}_s"] = delays[k - 1] / 1e6 if 1 <= k <= len(delays) else None
    return times


def by(rows: list, key) -> dict:
    groups = defaultdict(list)
    for row in rows:
        groups[key(row)].append(row)
    return dict(groups)


def percentile(values: list[int], fraction: float) -> float:
    """Linear interpolation between the two nearest ranks (numpy's default)."""
    ordered = sorted(values)
    position = fraction * (len(ordered) - 1)
    low = math.floor(position)
    high = math.ceil(position)
    return ordered[low] + (position - low) * (ordered[high] - ordered[low])


def hop_count(sender: Client, receiver: Client) -> int:
    """Dispatchers on the tree path between the two clients' leaves, each once."""
    parents = dict(Dispatcher.objects.values_list("pk", "parent_id"))

    def path(leaf: int) -> list[int]:
        chain = [leaf]
        while parents[chain[-1]] is not None:
            chain.append(parents[chain[-1]])
        return chain

    up, down = path(sender.dispatcher_id), path(receiver.dispatcher_id)
    common = next(node for node in up if node in down)
    return up.index(common) + down.index(common) + 1
