"""A year of incidents: the console's pages with a year of history against a day of it,
the database's size before and after retention, the time to drop a day, and a send's
latency while days are dropped.

Run as a module from the repository root, with the project's interpreter (.venv/bin/python):

    python -m bench.lifecycle                          # 50 million deliveries over 365 days
    python -m bench.lifecycle --deliveries 2000000 --days 60 --retain-days 30
    python -m bench.lifecycle --reuse                  # measure again what an earlier run loaded

Into a private PostgreSQL under var/bench-lifecycle (unless DATABASE_URL / REDIS_URL are
set): the scenario, then today's incident (the "day" history: the recent event whose page
is timed is in it), the pages timed; then the other days of the year loaded behind it,
each a synthetic incident written with COPY (demo.synthetic, into its day's partitions),
and the pages timed again. Then --standing-values attribute values of the fleet set on
the year's first day, and retention at --retain-days: the reports' export, and each day
past it dropped (lifecycle.retention; the attribute history's first day carrying those
values into the first day kept) while another thread sends, as a sender
and the leaves would, and times each send to its deliveries. Pages are sent in-process
with django.test.Client (2 warm-ups, --runs timed runs, medians). Exits 1 if a page's
median with the year exceeds 1.3 times its median with a day, a day's drop takes 10 s
or more, or a send during the drops takes 1 s or more.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from bench.console import logged_in_client, measure
from bench.services import fresh_database, run_in_process

ROOT = Path(__file__).resolve().parent.parent
FOLDER = ROOT / "var" / "bench-lifecycle"
PAGE_RATIO = 1.3
DROP_BUDGET_S = 10.0
SEND_BUDGET_S = 1.0
SEND_RECEIVERS = 200  # a send's deliveries, recorded as its leaves record them
TODAY_AT_LEAST = 60_000  # deliveries today: some 70 events, more than the events list's page


def load_day(days_ago: int, deliveries: int, servers: int) -> int:
    """One day's incident, `days_ago` days back (0: the last hours); its deliveries."""
    from django.utils import timezone

    from demo.synthetic import Request, generate_traffic

    start = timezone.now() - timedelta(days=days_ago, hours=3)
    request = Request(
        deliveries=deliveries,
        start=start,
        servers=servers,
        controllers=0,
        seed=days_ago + 1,
        audit_answers=False,
        analyze=False,  # once, before the pages are timed
    )
    return generate_traffic(request).deliveries


def load_year(args) -> None:
    """The days before today's, oldest last, each its share of the deliveries."""
    per_day = args.deliveries // args.days
    started = time.monotonic()
    written = 0
    for days_ago in range(1, args.days):
        written += load_day(days_ago, per_day, args.servers)
        if days_ago % 10 == 0:
            rate = written / (time.monotonic() - started)
            print(f"  loaded {days_ago} days, {written:,} deliveries ({rate:,.0f} a second)")
    print(f"loaded the year: {written:,} deliveries in {time.monotonic() - started:.0f} s")


def pages() -> list[tuple]:
    """The pages timed: the fleet, the events list, the newest event's, the audit log."""
    from broker.models import Event

    recent = Event.objects.filter(deliveries__isnull=False).order_by("-published_at").first()
    return [
        ("fleet", "GET", "/fleet/", None),
        ("events", "GET", "/events/", None),
        ("a recent event", "GET", f"/events/{recent.pk}/", None),
        ("audit log", "GET", "/audit/", None),
    ]


def time_pages(runs: int) -> dict[str, dict]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    client = logged_in_client()
    return {request[0]: measure(client, request, runs) for request in pages()}


def database_size() -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_database_size(current_database())")
        return cursor.fetchone()[0]


def counts() -> str:
    from broker.models import AuditEntry, Delivery, Event, TrafficRecord

    return (
        f"{Event.objects.count():,} events, {Delivery.objects.count():,} deliveries,"
        f" {TrafficRecord.objects.count():,} hops, {AuditEntry.objects.count():,} audit entries"
    )


class Sender(threading.Thread):
    """Sends one event after another, each to SEND_RECEIVERS receivers (published as
    its sender would, its deliveries recorded as its leaves would), timing each whole."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.latencies: list[float] = []
        self.started: list[float] = []  # when each began (time.perf_counter)
        self.stop = threading.Event()

    def run(self) -> None:
        from django.db import connection

        from bench.console_events import _publish, record_deliveries, spread_receivers, template

        receivers = spread_receivers(SEND_RECEIVERS)
        try:
            while not self.stop.is_set():
                started = time.perf_counter()
                event = _publish(template("status"), recipients=receivers)
                record_deliveries(event, receivers)
                self.latencies.append(time.perf_counter() - started)
                self.started.append(started)
                time.sleep(0.05)
        finally:
            connection.close()


def sends_during(work) -> tuple[object, Sender]:
    """`work()`'s result, and the sender that sent while it ran."""
    sender = Sender()
    sender.start()
    try:
        result = work()
    finally:
        sender.stop.set()
        sender.join()
    return result, sender


def sends_in(sender: Sender, spans: list[tuple[float, float]]) -> list[float]:
    """The latencies of the sends that began or ended within one of `spans`."""
    return [
        latency
        for began, latency in zip(sender.started, sender.latencies, strict=True)
        if any(began < end and began + latency > start for start, end in spans)
    ]


def apply_retention(retain_days: int) -> dict[str, list[tuple[float, float]]]:
    """When each step ran (time.perf_counter spans): the export, the carry of the
    attribute values, and each day's drop by table."""
    from django.conf import settings

    from lifecycle.partitions import ATTRIBUTE_HISTORY, PARTITIONED
    from lifecycle.retention import Retention, carry_forward, drop_past_day, droppable_days
    from reports.export import export_changes

    settings.RETAIN_DAYS_BY_GROUP = dict.fromkeys(settings.RETAIN_DAYS_BY_GROUP, retain_days)
    spans = {}

    def timed(step: str, work):
        started = time.perf_counter()
        result = work()
        spans.setdefault(step, []).append((started, time.perf_counter()))
        return result

    timed("export", export_changes)
    kept = Retention()
    for table in PARTITIONED:  # as lifecycle.retention.apply_retention, each step timed
        droppable = droppable_days(table, kept)
        if table is ATTRIBUTE_HISTORY and droppable:
            carried = timed("carry", carry_forward)
            print(f"values carried forward: {carried:,}")
        for day in droppable:
            timed(table.table, lambda table=table, day=day: drop_past_day(table, day))
    for waiting in kept.waiting:
        print(f"  kept {waiting.table} of {waiting.day}: {waiting.why}")
    return spans


# A fleet's values, each standing since a day past retention: `names` attributes of
# every server, written on `day` as the attribute history's trigger writes them.
STANDING_VALUES = """
INSERT INTO broker_attributehistory (client_id, name, kind, value, source, set_at, at)
SELECT c.id, 'bench_' || n, 'set', to_jsonb(n), 'client', t.at, t.at
FROM broker_client c CROSS JOIN generate_series(1, %(names)s) AS n
CROSS JOIN LATERAL (SELECT %(day)s::timestamptz + c.id * interval '1 ms' AS at) AS t
"""


def standing_values(values: int, days: int) -> None:
    """Some `values` attribute values of the fleet, set on the oldest day of the year
    and standing since: retention carries them into the first day it keeps."""
    from django.db import connection

    from lifecycle.partitions import ATTRIBUTE_HISTORY, day_start, ensure_day, today

    day = today() - timedelta(days=days - 1)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM broker_attributehistory"
            " WHERE name LIKE 'bench_%%' AND carried_from IS NULL"
        )
        if cursor.fetchone()[0]:
            return  # written by the run that loaded this database
        cursor.execute("SELECT count(*) FROM broker_client")
        names = max(1, values // cursor.fetchone()[0])
        ensure_day(ATTRIBUTE_HISTORY, day)
        cursor.execute(STANDING_VALUES, {"names": names, "day": day_start(day)})
        print(f"standing attribute values set on {day}: {cursor.rowcount:,}")


def ms(values: list[float]) -> str:
    if not values:
        return "none"
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))]
    return (
        f"median {statistics.median(values) * 1000:.0f} ms, p95 {p95 * 1000:.0f} ms,"
        f" max {max(values) * 1000:.0f} ms ({len(values)})"
    )


def report_pages(day: dict[str, dict], year: dict[str, dict]) -> bool:
    print(f"{'page':>16}  {'a day':>10}  {'the year':>10}  {'ratio':>6}  queries")
    ok = True
    for label, first in day.items():
        then = year[label]
        ratio = then["median"] / first["median"]
        over = ratio > PAGE_RATIO or then["status"] >= 400
        ok = ok and not over
        print(
            f"{label:>16}  {first['median']:7.1f} ms  {then['median']:7.1f} ms  {ratio:5.2f}x"
            f"  {first['queries']} / {then['queries']}{'  OVER' if over else ''}"
        )
    return ok


def set_up(env: dict[str, str], *, keep: bool) -> bool:
    """The database of `env` (made anew unless `keep`), Django, the static files;
    whether the database was made anew."""
    import django

    made = fresh_database(env, keep=keep)
    os.environ.update(env)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    os.environ.setdefault("REPORTS_DATASET", str(FOLDER / "dataset"))
    django.setup()
    from django.core.management import call_command

    call_command("collectstatic", interactive=False, verbosity=0)  # pages link to them
    return made


def load_today(args) -> None:
    from demo.scenario import load_scenario

    load_scenario(servers=0)
    # At least a page of events (50) on the events list, as with the year.
    load_day(0, max(args.deliveries // args.days, TODAY_AT_LEAST), args.servers)


def day_pages(args, env: dict[str, str]) -> dict[str, dict]:
    """The pages with a day of history, timed in a database of their own on the same
    server, by this bench in a process of its own (`--only-a-day`), just before the
    year's: a database that keeps its year for `--reuse` is never emptied for it."""
    parts = urlsplit(env["DATABASE_URL"])
    day_url = urlunsplit(parts._replace(path=parts.path.rstrip("/") + "_day"))
    child_env = {**env, "DATABASE_URL": day_url}
    argv = [sys.executable, "-m", "bench.lifecycle", "--only-a-day", "--runs", str(args.runs)]
    argv += ["--deliveries", str(args.deliveries), "--days", str(args.days)]
    argv += ["--servers", str(args.servers)]
    found = subprocess.run(argv, env=child_env, cwd=ROOT, check=True, capture_output=True)
    lines = found.stdout.decode().splitlines()
    print(lines[-2])
    return json.loads(lines[-1])


def only_a_day(args, env: dict[str, str]) -> bool:
    set_up(env, keep=False)
    load_today(args)
    print(f"a day: {counts()}")
    print(json.dumps(time_pages(args.runs)))
    return True


def run(args, env: dict[str, str]) -> bool:
    if args.only_a_day:
        return only_a_day(args, env)
    day = day_pages(args, env)
    if set_up(env, keep=args.reuse):
        load_today(args)
        load_year(args)
    standing_values(args.standing_values, args.days)
    print(f"the year: {counts()}, {database_size() / 2**30:.2f} GiB")
    year = time_pages(args.runs)
    ok = report_pages(day, year)
    _, before = sends_during(lambda: time.sleep(5))
    print(f"sends, nothing dropped: {ms(before.latencies)}")
    spans, sender = sends_during(lambda: apply_retention(args.retain_days))
    ok = report_retention(spans, sender) and ok
    print(f"after retention at {args.retain_days} days: {counts()},")
    print(f"  {database_size() / 2**30:.2f} GiB")
    return ok


def report_retention(spans: dict[str, list], sender: Sender) -> bool:
    """Print how long each step took and the sends made meanwhile; whether every drop
    and every send during the drops kept to its budget."""
    drops = {step: found for step, found in spans.items() if step not in ("export", "carry")}
    every_drop = [span for found in drops.values() for span in found]
    for step, label in (("export", "the export before retention"), ("carry", "the carry")):
        found = spans.get(step, [])
        print(f"{label}: {ms(seconds(found))}; sends {ms(sends_in(sender, found))}")
    print(f"days dropped: {ms(seconds(every_drop))}")
    for table, found in drops.items():
        print(f"  {table}: {ms(seconds(found))}")
    during = sends_in(sender, every_drop)
    print(f"sends while days were dropped: {ms(during)}")
    ok = all(taken < DROP_BUDGET_S for taken in seconds(every_drop))
    return ok and all(taken < SEND_BUDGET_S for taken in during)


def seconds(spans: list[tuple[float, float]]) -> list[float]:
    return [end - start for start, end in spans]


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.lifecycle", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--deliveries", type=int, default=50_000_000, help="over the year")
    parser.add_argument("--days", type=int, default=365, help="days of history")
    parser.add_argument("--servers", type=int, default=5_000, help="the fleet")
    parser.add_argument("--retain-days", type=int, default=90, help="RETAIN_DAYS applied")
    parser.add_argument("--runs", type=int, default=10, help="timed runs per page")
    parser.add_argument(
        "--standing-values",
        type=int,
        default=1_000_000,
        help="attribute values standing since the year's first day, carried by retention",
    )
    parser.add_argument("--reuse", action="store_true", help="keep the loaded database")
    parser.add_argument(
        "--only-a-day", action="store_true", help="(internal) time the pages with a day"
    )
    run_in_process(run, parser.parse_args(), FOLDER)


if __name__ == "__main__":
    main()
