"""What `/metrics` tells a Prometheus server (console/views/metrics.py serves it).

Two kinds of figure:

- Read when scraped, from PostgreSQL and Redis, so that every web process on every
  host gives the same: deliveries by state, connected agents, hops waiting at each
  dispatcher, each hop's wait from its arrival to its routing (counted in Redis by
  every tree worker, broker/dispatch/latency.py, as tree workers seldom share a host
  with a web process), report runs and their durations, the live processes by host
  and role.
- Measured inside the processes: each push's latency in the web processes
  (`sn_push_seconds`, broker.push.layer). Under `./run` every process of the host
  writes them into PROMETHEUS_MULTIPROC_DIR, prometheus-client's multiprocess mode,
  and a scrape sums the host's processes; without that folder a scrape gives the
  serving process's own.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator

from django.conf import settings
from django.core.cache import cache
from django.utils import timezone
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest, multiprocess
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from broker.dispatch import latency, transport
from broker.dispatch.queues import dispatcher_queues
from broker.push import outages
from broker.reads.deliveries import counts_by_state
from broker.reads.presence import connected_count
from console.processes import processes_now
from reports.reads import finished_run_seconds

# Counting every delivery scans the table: once a minute at most, whoever scrapes.
DELIVERY_COUNTS_KEY = "metrics:deliveries-by-state"
DELIVERY_COUNTS_FOR_S = 60
RUN_BUCKETS_S = (1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800)


def exposition() -> bytes:
    """The figures in Prometheus' text format: the processes', then the service's."""
    service = CollectorRegistry()
    service.register(ServiceCollector())
    return _processes() + generate_latest(service)


def _processes() -> bytes:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return generate_latest(registry)
    return generate_latest(REGISTRY)  # this process's own, with its process figures


class ServiceCollector:
    """The figures read from PostgreSQL and Redis when scraped."""

    def collect(self) -> Iterator[Metric]:
        yield _deliveries_by_state()
        yield _connected_agents()
        yield from _dispatcher_backlog()
        yield from _hop_latencies()
        yield from _report_runs()
        yield from _live_processes()


def _deliveries_by_state() -> Metric:
    family = GaugeMetricFamily(
        "sn_deliveries",
        f"Deliveries by state (counted at most every {DELIVERY_COUNTS_FOR_S} s)",
        labels=["state"],
    )
    for state, count in _delivery_counts().items():
        family.add_metric([state], count)
    return family


def _delivery_counts() -> dict[str, int]:
    try:
        return cache.get_or_set(DELIVERY_COUNTS_KEY, counts_by_state, DELIVERY_COUNTS_FOR_S)
    except Exception as error:  # the cache is on Redis: counted afresh while it is down
        if not outages.is_outage(error):
            raise
        return counts_by_state()


def _connected_agents() -> Metric:
    family = GaugeMetricFamily(
        "sn_agents_connected", "Clients with a logged-in session seen recently (as the console)"
    )
    family.add_metric([], connected_count(timezone.now()))
    return family


def _dispatcher_backlog() -> Iterator[Metric]:
    """Hops waiting at each dispatcher (by its queue), and those set aside; nothing
    while Redis is down (the outage is the health page's news)."""
    queues = dispatcher_queues(settings.TREE_DEPTH, settings.TREE_BRANCHING)
    try:
        waiting, set_aside = transport.waiting_by_queue(queues), transport.set_aside()
    except Exception as error:
        if not outages.is_outage(error):
            raise
        return
    family = GaugeMetricFamily(
        "sn_dispatcher_hops_waiting",
        "Hops in a dispatcher's stream, waiting or being routed",
        labels=["dispatcher"],
    )
    for queue, count in sorted(waiting.items()):
        family.add_metric([queue], count)
    yield family
    aside = GaugeMetricFamily("sn_hops_set_aside", "Hops set aside after failing repeatedly")
    aside.add_metric([], set_aside)
    yield aside


def _hop_latencies() -> Iterator[Metric]:
    """Seconds from a hop's arrival at a dispatcher's stream to its routing, by tree
    level, over every tree worker; nothing while Redis is down."""
    try:
        levels = latency.read(transport.broker_redis())
    except Exception as error:
        if not outages.is_outage(error):
            raise
        return
    family = HistogramMetricFamily(
        "sn_hop_seconds",
        "Seconds from a hop's arrival at a dispatcher's stream to its routing, by tree level",
        labels=["level"],
    )
    bounds = [floatToGoString(bound) for bound in latency.BUCKETS_S] + ["+Inf"]
    for level in levels:
        buckets = list(zip(bounds, level.counts, strict=True))
        family.add_metric([str(level.level)], buckets, sum_value=level.sum_s)
    yield family


def _live_processes() -> Iterator[Metric]:
    """The processes not late, by host and role, as the health page judges them (a
    monitor alerts on no tree worker, or on a number of beats other than one);
    nothing while Redis is down."""
    found = processes_now()
    if found.unknown:
        return
    family = GaugeMetricFamily(
        "sn_processes", "The console's live processes by host and role", labels=["host", "role"]
    )
    for host, rows in found.by_host.items():
        for role, count in sorted(Counter(row.role for row in rows if not row.late).items()):
            family.add_metric([host, role], count)
    yield family


def _report_runs() -> Iterator[Metric]:
    runs = finished_run_seconds()
    family = HistogramMetricFamily(
        "sn_report_run_seconds",
        "Finished report runs by kind and outcome: seconds from start to finish",
        labels=["kind", "state"],
    )
    for (kind, state), seconds in sorted(_grouped(runs).items()):
        buckets = [(floatToGoString(b), sum(1 for s in seconds if s <= b)) for b in RUN_BUCKETS_S]
        family.add_metric([kind, state], [*buckets, ("+Inf", len(seconds))], sum(seconds))
    yield family


def _grouped(runs: list[tuple[str, str, float]]) -> dict[tuple[str, str], list[float]]:
    grouped: dict[tuple[str, str], list[float]] = {}
    for kind, state, seconds in runs:
        grouped.setdefault((kind, state), []).append(seconds)
    return grouped
