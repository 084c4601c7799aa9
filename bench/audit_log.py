"""The Audit log page and its CSV export with a long log: how fast each answers.

Run as a module from the repository root, with the project's interpreter (.venv/bin/python):

    python -m bench.audit_log                     # 300,000 entries, 20 runs a request
    python -m bench.audit_log --reuse             # keep (and reuse) what an earlier run loaded
    python -m bench.audit_log --entries 1000000 --runs 10

The log is written with COPY into a private PostgreSQL under var/bench-audit (unless
DATABASE_URL / REDIS_URL are set), spread over 90 days as a busy console writes it:
mostly refusals at the leaves and publishes by three controllers, agents' attribute
changes and acknowledgements, operators' logins and changes; then ANALYZEd.

Each request is sent in-process with django.test.Client as in bench/console.py (2
warm-ups, --runs timed runs, one more that counts SQL queries). Then the CSV export of
the whole log and of a filtered part is read to the end, once each, timed. Exits 1 if a
page's median exceeds --budget-ms (issue 11: 500 ms) or a request answers 4xx/5xx.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
import uuid
from datetime import timedelta
from pathlib import Path

from bench.console import BASELINE, logged_in_client, measure, report
from bench.services import fresh_database, run_in_process

ROOT = Path(__file__).resolve().parent.parent

FOLDER = ROOT / "var" / "bench-audit"
CONTROLLERS = ("northwest-controller", "intellimune-national", "rogue-controller")
OPERATORS = ("olivia", "paula", "trevor", "audrey", "adam")
SERVERS = 100_000
DAYS = 90
BATCH = 50_000


def kinds(rng: random.Random, events: list[str]) -> list[tuple[float, callable]]:
    """(weight, a function giving (actor, action, target, outcome, reason, details))."""

    def server() -> str:
        return f"web-{rng.randrange(SERVERS):05d}"

    def refusal():
        names = sorted(server() for _ in range(10))
        details = {"leaf": rng.randrange(8), "receivers": {"names": names, "unlisted": 40}}
        return (
            f"client:{rng.choice(CONTROLLERS)}",
            "event.refused_by_policy",
            f"event:{rng.choice(events)}",
            "refused",
            "50 receivers addressed here refuse this sender and content",
            details,
        )

    def publish():
        name = rng.choice(CONTROLLERS)
        return (
            f"client:{name}",
            "event.publish",
            f"client:{name}",
            "done",
            "",
            {"channel": "default"},
        )

    def stated():
        name = server()
        return (
            f"client:{name}",
            "attributes.state",
            f"client:{name}",
            "done",
            "",
            {"values": {"load": round(rng.random(), 2)}},
        )

    def ack():
        return (
            f"client:{server()}",
            "delivery.ack",
            f"event:{rng.choice(events)}",
            "done",
            "",
            {"ok": True},
        )

    def login():
        refused = rng.random() < 0.05
        return (
            f"user:{rng.choice(OPERATORS)}",
            "console.login",
            "console",
            "refused" if refused else "done",
            "wrong username or password" if refused else "",
            {},
        )

    def policy():
        return (
            "user:paula",
            "policy.set",
            f"clients:{rng.randrange(1, 25_000)}",
            "done",
            "",
            {"selection": 'region == "Northwest"', "policy": "accept true"},
        )

    def attest():
        return (
            "authority:trust-manager",
            "attributes.attest",
            f"client:{server()}",
            "done",
            "",
            {"values": {"trust": 2}},
        )

    def revoke():
        return (
            "user:olivia",
            "client.revoke_tokens",
            f"client:{server()}",
            "done",
            "",
            {"revoked": 1},
        )

    return [(35, refusal), (20, publish), (15, stated), (10, ack), (8, login), (5, policy),
            (4, attest), (3, revoke)]  # fmt: skip


def load(entries: int) -> None:
    """`entries` audit entries (those missing only), then fresh planner statistics."""
    from django.core.management import call_command
    from django.db import connection, transaction
    from django.utils import timezone

    from broker.models import AuditEntry
    from demo.bulk import copy_rows

    call_command("collectstatic", interactive=False, verbosity=0)  # pages link to them
    missing = entries - AuditEntry.objects.count()
    rng = random.Random(11)
    events = [str(uuid.UUID(int=rng.getrandbits(128))) for _ in range(3_000)]
    weights, makers = zip(*kinds(rng, events), strict=True)
    now = timezone.now()
    started = time.monotonic()
    fields = ["at", "actor", "action", "target", "outcome", "reason", "details"]
    for start in range(0, max(missing, 0), BATCH):
        rows = []
        for _ in range(min(BATCH, missing - start)):
            actor, action, target, outcome, reason, details = rng.choices(makers, weights)[0]()
            at = now - timedelta(seconds=rng.uniform(0, DAYS * 86_400))
            rows.append((at, actor, action, target, outcome, reason, json.dumps(details)))
        with transaction.atomic():
            copy_rows(AuditEntry, fields, rows)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE broker_auditentry")
    print(f"set-up: {max(missing, 0)} entries written and analysed in "
          f"{time.monotonic() - started:.1f} s", flush=True)  # fmt: skip


def requests() -> list[tuple]:
    """The pages to time, with a page far in found in the log as loaded."""
    from broker.models import AuditEntry

    total = AuditEntry.objects.count()
    middle = AuditEntry.objects.order_by("-at", "-id").values_list("pk", flat=True)[total // 2]
    group = AuditEntry.objects.filter(actor="client:intellimune-national")
    # 40,000 entries into one actor's (or half way, in a small log).
    in_group = group.order_by("-at", "-id").values_list("pk", flat=True)[
        min(40_000, group.count() // 2)
    ]
    day = (AuditEntry.objects.order_by("at").first().at + timedelta(days=30)).date()
    htmx = {"HTTP_HX_REQUEST": "true"}
    return [
        ("page 1, newest first", "GET", "/audit/", None),
        ("page 1, htmx fragment", "GET", "/audit/", None, htmx),
        ("actor = user:audrey", "GET", "/audit/", {"actor": "user:audrey"}),
        ("actor prefix client:", "GET", "/audit/", {"actor": "client:"}),
        ("action prefix event.", "GET", "/audit/", {"action": "event."}),
        ("action = console.login", "GET", "/audit/", {"action": "console.login"}),
        ("target = client:web-04242", "GET", "/audit/", {"target": "client:web-04242"}),
        ("target contains web-0424", "GET", "/audit/", {"target": "*web-0424*"}),
        ("outcome refused", "GET", "/audit/", {"outcome": "refused"}),
        ("one day, a month ago", "GET", "/audit/", {"from": str(day), "to": str(day)}),
        ("users' refusals, one day", "GET", "/audit/",
         {"actor": "user:*", "outcome": "refused", "from": str(day), "to": str(day)}),
        ("sorted by actor", "GET", "/audit/", {"sort": "actor"}),
        ("sorted by actor, Z to A", "GET", "/audit/", {"sort": "-actor"}),
        ("sorted by action", "GET", "/audit/", {"sort": "action"}),
        ("a page half-way down", "GET", "/audit/", {"after": str(middle)}),
        ("by actor, 40,000 into one", "GET", "/audit/", {"sort": "actor", "after": str(in_group)}),
        ("previous page, half-way", "GET", "/audit/", {"before": str(middle)}),
    ]  # fmt: skip


def time_export(client, label: str, params: dict) -> None:
    """Read one export to its end; print its rows, size and time."""
    started = time.perf_counter()
    response = client.get("/audit/export.csv", params)
    size, lines = 0, 0
    for chunk in response.streaming_content:
        size += len(chunk)
        lines += chunk.count(b"\n")
    elapsed = time.perf_counter() - started
    print(f"{'CSV: ' + label:>32}  {elapsed * 1000:8.0f} ms  {lines - 1:>9,} rows  "
          f"{size / 1e6:6.1f} MB  {response.status_code}")  # fmt: skip


def run(args, env: dict[str, str]) -> bool:
    import django

    fresh_database(env, keep=args.reuse)
    os.environ.update(env)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    django.setup()
    from broker.models import AuditEntry

    load(args.entries)
    print(f"audit log: {AuditEntry.objects.count():,} entries, {args.runs} runs a request")
    client = logged_in_client()
    baseline = measure(client, BASELINE, args.runs)
    results = []
    for request in requests():
        headers = request[4] if len(request) > 4 else {}
        client.defaults.update(headers)  # measure() sends none of its own
        results.append(measure(client, request[:4], args.runs))
        for name in headers:
            client.defaults.pop(name)
    ok = report(results, baseline, args.budget_ms)
    time_export(client, "the whole log", {})
    time_export(client, "refusals of a controller", {"actor": "client:rogue-controller"})
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.audit_log", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--entries", type=int, default=300_000, help="audit entries to load")
    parser.add_argument("--runs", type=int, default=20, help="timed runs per request")
    parser.add_argument("--budget-ms", type=float, default=500.0, help="highest median allowed")
    parser.add_argument("--reuse", action="store_true", help="keep the loaded database")
    run_in_process(run, parser.parse_args(), FOLDER)


if __name__ == "__main__":
    main()
