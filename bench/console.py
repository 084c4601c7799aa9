"""The console's pages with a fleet of 100,000 clients: how fast each answers, and how
many SQL queries it takes.

    python bench/console.py                  # load 100,000 web servers, 20 runs a page
    python bench/console.py --reuse          # keep (and reuse) what an earlier run loaded
    python bench/console.py --servers 10000 --runs 50 --budget-ms 300

The scenario is loaded in bulk (`load_scenario --bulk`) into a private PostgreSQL under
var/bench-console (unless DATABASE_URL / REDIS_URL are set), then ANALYZEd, as autovacuum
would soon do after such a load. Loading 100,000 servers takes a minute or two: with
--reuse the database is kept and only the missing servers are added.

Each request of REQUESTS below is sent in-process with django.test.Client (the whole
Django stack: middleware, views, templates, the database; no HTTP server), as a
superuser logged in with a session that also sends an operator API token (so API paths
work too): 2 warm-ups, then --runs timed runs, then one run that counts SQL queries.

Printed per request: median and p95 in ms, SQL queries, and the median as a multiple of
the baseline measured in the same run: GET /login/, a template rendered with no query
beyond the session's. Exits 1 if a median exceeds --budget-ms (issue 10: 500 ms), or if
a request answers 4xx/5xx.
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.services import fresh_database, provide_services  # noqa: E402

FOLDER = ROOT / "var" / "bench-console"
WARM_UPS = 2

# (label, method, path, data): data is sent as query parameters (GET) or a form (POST).
# The scenario's policy without the Intellimune clause: its commands become refused.
PREVIEWED_POLICY = """accept event.alert exists and event.threat_level >= 4
    and sender.region == "Northwest" and sender.trust >= 2"""
REQUESTS = [
    ("home page", "GET", "/", None),
    ("API: clients, first page", "GET", "/api/v1/clients?limit=100", None),
    ("API: clients, a page far in", "GET", "/api/v1/clients?limit=100&offset=90000", None),
    ("fleet: everything", "GET", "/fleet/", None),
    ("fleet: search + facets", "GET", "/fleet/", {"q": 'software == "IIS" and version ~ "2.4.*"'}),
    ("fleet: search, far page", "GET", "/fleet/", {"q": "cgi", "page": "1000"}),
    ("fleet: sorted by model", "GET", "/fleet/", {"q": 'region == "Northwest"', "sort": "-model"}),
    ("client page", "GET", "/clients/web-04242/", None),
    ("dispatcher tree", "GET", "/tree/", None),
    ("policy preview, 25k receivers", "POST", "/policies/preview",
     {"policy": PREVIEWED_POLICY, "selector": 'region == "Northwest"'}),
    ("policy preview, every server", "POST", "/policies/preview",
     {"policy": PREVIEWED_POLICY, "selector": 'organization == "Macrocorp"'}),
]  # fmt: skip
RECENT_EVENTS = 300  # what the policy preview weighs (it reads at most 500)
BASELINE = ("baseline: login page", "GET", "/login/", None)


def load(servers: int) -> None:
    """The scenario with `servers` web servers (those missing only), then fresh
    planner statistics: COPY leaves the tables unanalysed until autovacuum comes."""
    from django.core.management import call_command
    from django.db import connection

    call_command("collectstatic", interactive=False, verbosity=0)  # pages link to them
    call_command("load_scenario", servers=servers, bulk=True)
    publish_recent_events()
    started = time.monotonic()
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    print(f"set-up: ANALYZE in {time.monotonic() - started:.1f} s", flush=True)


def publish_recent_events() -> None:
    """The scenario's alerts and commands, so that the policy preview has recent events
    to weigh (routing them is not this bench's business: no worker runs)."""
    from broker.audit import Actor
    from broker.models import Client, Event
    from broker.services.events import publish_event

    missing = RECENT_EVENTS - Event.objects.count()
    senders = {c.name: c for c in Client.objects.filter(can_send=True)}
    for index in range(max(missing, 0)):
        name, content, selector = SCENARIO_EVENTS[index % len(SCENARIO_EVENTS)]
        publish_event(
            sender=senders[name], actor=Actor("client", name), content=content,
            selector=selector, lifetime_s=3600, channel="default", idempotency_key=None,
        )  # fmt: skip


SCENARIO_EVENTS = [
    ("northwest-controller", {"alert": "worm", "threat_level": 4, "target": "IIS",
     "version": "2.4.*"}, 'region == "Northwest"'),
    ("intellimune-national", {"kind": "command", "action": "disable-cgi"},
     'software == "IIS" and version ~ "2.4.*" and cgi'),
    ("rogue-controller", {"alert": "worm", "threat_level": 5}, ""),
]  # fmt: skip


def logged_in_client():
    """A test client logged in as a superuser, sending an operator token as well."""
    from django.contrib.auth import get_user_model
    from django.test import Client

    from broker.audit import Actor
    from broker.services.operators import issue_operator_token

    user, _ = get_user_model().objects.get_or_create(
        username="bench-admin", defaults={"is_staff": True, "is_superuser": True}
    )
    bench = Actor("system", "bench")
    token = issue_operator_token(user=user, label="bench/console.py", actor=bench)
    client = Client(HTTP_HOST="localhost", HTTP_AUTHORIZATION=f"Bearer {token}")
    client.force_login(user)
    return client


def send(client, method: str, path: str, data: dict | None):
    return getattr(client, method.lower())(path, data or {})


def measure(client, request: tuple, runs: int) -> dict:
    """Timings of `runs` runs after the warm-ups, and the queries of one more run."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    label, method, path, data = request
    for _ in range(WARM_UPS):
        send(client, method, path, data)
    timings = []
    for _ in range(runs):
        started = time.perf_counter()
        response = send(client, method, path, data)
        timings.append((time.perf_counter() - started) * 1000)
    with CaptureQueriesContext(connection) as queries:
        send(client, method, path, data)
    timings.sort()
    return {
        "label": label,
        "status": response.status_code,
        "median": statistics.median(timings),
        "p95": timings[min(runs - 1, int(runs * 0.95))],
        "queries": len(queries),
    }


def report(results: list[dict], baseline: dict, budget_ms: float) -> bool:
    """Print the table; whether every request answered well within the budget."""
    print(f"{'':>32}  {'median':>9}  {'p95':>9}  {'queries':>7}  {'x baseline':>10}  status")
    ok = True
    for row in [baseline, *results]:
        over = row["median"] > budget_ms or row["status"] >= 400
        ok = ok and not over
        print(
            f"{row['label']:>32}  {row['median']:6.1f} ms  {row['p95']:6.1f} ms  "
            f"{row['queries']:>7}  {row['median'] / baseline['median']:>9.1f}x  "
            f"{row['status']}{'  OVER BUDGET' if row['median'] > budget_ms else ''}"
        )
    return ok


def run(args, env: dict[str, str]) -> bool:
    import django

    fresh_database(env, keep=args.reuse)
    os.environ.update(env)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    django.setup()
    from broker.models import Client

    load(args.servers)
    clients = Client.objects.count()
    print(f"console: {clients} clients, {args.runs} runs a request after {WARM_UPS} warm-ups")
    client = logged_in_client()
    started = time.monotonic()
    send(client, "GET", "/fleet/", None)
    print(f"the directory of {clients} clients built in {time.monotonic() - started:.1f} s")
    baseline = measure(client, BASELINE, args.runs)
    results = [measure(client, request, args.runs) for request in REQUESTS]
    return report(results, baseline, args.budget_ms)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--servers", type=int, default=100_000, help="web servers to load")
    parser.add_argument("--runs", type=int, default=20, help="timed runs per request")
    parser.add_argument("--budget-ms", type=float, default=500.0, help="highest median allowed")
    parser.add_argument("--reuse", action="store_true", help="keep the loaded database")
    args = parser.parse_args()
    env = dict(os.environ)
    env.setdefault("SECRET_KEY", secrets.token_urlsafe(40))
    env.setdefault("LOG_LEVEL", "WARNING")
    env.setdefault("STATIC_ROOT", str(FOLDER / "static"))
    started = provide_services(env, FOLDER)
    try:
        ok = run(args, env)
    finally:
        for server in reversed(started):
            server.stop()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
