"""How long hops wait, from their arrival in a dispatcher's stream to their routing,
counted in Redis for the whole deployment.

A process-local histogram would be seen only by a scrape of its own host, and tree
workers usually run on hosts with no web process to serve /metrics. So each routed
batch adds its hops to per-level bucket counters in Redis, in the pipeline that
acknowledges them, and any web process's /metrics reads the sums (console/metrics.py:
`sn_hop_seconds`). The counters only grow, as Prometheus expects of a histogram; a
Redis that lost its data starts them again from zero, which Prometheus reads as a
restart.
"""

from __future__ import annotations

import bisect
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

KEY_PREFIX = "sn-metrics:hop-seconds:"
BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


@dataclass(frozen=True)
class HopAges:
    """A level's histogram: `counts[i]` hops took at most BUCKETS_S[i] (cumulative:
    the last, +Inf, is every hop), and the sum of their seconds."""

    level: int
    counts: list[int]
    sum_s: float


def record(pipeline, arrivals: Iterable[tuple[str, bytes]], *, now_s: float | None = None):
    """Add the hops of (stream, entry id) to their levels' counters, in `pipeline`.
    A stream entry's id starts with the Redis server's clock at its arrival, in ms."""
    now_ms = (now_s if now_s is not None else time.time()) * 1000
    by_level: dict[int, list[float]] = defaultdict(list)
    for stream, entry_id in arrivals:
        arrived_ms = int(entry_id.split(b"-", 1)[0])
        level = stream.count(".") - 1  # sn-tree:hops:dispatcher.d0 is level 0
        by_level[level].append(max(0.0, now_ms - arrived_ms) / 1000)
    for level, ages in by_level.items():
        key = f"{KEY_PREFIX}{level}"
        # One command per bucket, not per hop: a batch holds up to hundreds of hops.
        for bucket, count in Counter(bisect.bisect_left(BUCKETS_S, age) for age in ages).items():
            pipeline.hincrby(key, f"b{bucket}", count)
        pipeline.hincrbyfloat(key, "sum", sum(ages))


def read(client) -> list[HopAges]:
    """Every level's histogram, root first."""
    keys = sorted(client.scan_iter(f"{KEY_PREFIX}*"), key=lambda key: int(key.rsplit(b":", 1)[1]))
    pipeline = client.pipeline(transaction=False)
    for key in keys:
        pipeline.hgetall(key)
    return [_histogram(key, raw) for key, raw in zip(keys, pipeline.execute(), strict=True)]


def _histogram(key: bytes, raw: dict[bytes, bytes]) -> HopAges:
    fields = {name.decode(): value for name, value in raw.items()}
    running, counts = 0, []
    for index in range(len(BUCKETS_S) + 1):  # the last: beyond every bucket, +Inf
        running += int(fields.get(f"b{index}", 0))
        counts.append(running)
    return HopAges(
        level=int(key.rsplit(b":", 1)[1]),
        counts=counts,
        sum_s=float(fields.get("sum", 0.0)),
    )
