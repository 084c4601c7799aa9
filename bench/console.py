"""The console's pages with a fleet of 100,000 clients: how fast each answers, and how
many SQL queries it takes; and how soon an event's page shows acknowledgements live.

Run as a module from the repository root, with the project's interpreter (.venv/bin/python):

    python -m bench.console                  # load 100,000 web servers, 20 runs a page
    python -m bench.console --reuse          # keep (and reuse) what an earlier run loaded
    python -m bench.console --servers 10000 --runs 50 --budget-ms 300

The scenario is loaded in bulk (`load_scenario --bulk`) into a private PostgreSQL under
var/bench-console (unless DATABASE_URL / REDIS_URL are set), its keys kept beside it in
var/bench-console/keys.json (never the demo's var/demo/keys.json), with the scenario's recent
events and one worm alert to the Northwest whose deliveries (one per Northwest server,
a quarter of the fleet) are recorded as the leaves record them and left in mixed
states (bench/console_events.py: half acknowledged, a tenth each failed with a result,
not yet received and expired, a fifth received without an answer); then ANALYZEd, as
autovacuum would soon do after such a load. Loading 100,000 servers takes a minute or
two: with --reuse the database is kept, only the missing servers are added and the
alert is found again.

Each request of REQUESTS and event_requests() below is sent in-process with
django.test.Client (the whole Django stack: middleware, views, templates, the
database; no HTTP server), as a superuser logged in with a session that also sends an
operator API token (so API paths work too): 2 warm-ups, then --runs timed runs, then
one run that counts SQL queries.
Besides issue 10's fleet, API and policy preview rows, issue 11 adds: the send page's
preview of the worm alert (northwest-controller to `region == "Northwest"`, ~25,000
receivers) and of the status command (intellimune-national, no selector: every
server), the list of events, and the page of the worm alert above.

Printed per request: median and p95 in ms, SQL queries, and the median as a multiple of
the baseline measured in the same run: GET /login/, a template rendered with no query
beyond the session's.

Then the live updates (bench/console_live.py, skipped with --no-live): a real web process
serves the console; a status command is recorded for 1,000 servers and received by
them; a reader watches its page over the console's socket as console.js does
(refreshing at most every 250 ms) while the bench acknowledges the 1,000 deliveries,
200 a second from four threads. Printed: median, p95 and max of the time from an
acknowledgement's commit to the first refreshed page that counts it, next to two
baselines measured in the same run: an announcement group_sent to the socket, and the
socket's ping round trip; then how long the acknowledgements took and how many times
the page was refreshed.

Exits 1 if a median exceeds --budget-ms (issues 10 and 11: 500 ms), if a request
answers 4xx/5xx, or if the live p95 exceeds --live-budget-ms (issue 11: 1,000 ms).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

from bench.services import fresh_database, run_in_process

ROOT = Path(__file__).resolve().parent.parent

FOLDER = ROOT / "var" / "bench-console"
# The keys of the scenario loaded into the bench's database, beside it: the demo's
# (var/demo/keys.json) belong to the demo's database.
KEYS_FILE_NAME = "keys.json"
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


def event_requests(event) -> list[tuple]:
    """Issue 11's requests, as REQUESTS: the send page's previews (read with Django set
    up), the events, and the page of `event`, the alert with ~25,000 deliveries."""
    from bench.console_events import preview_form

    return [
        ("send preview, 25k receivers", "POST", "/send/preview", preview_form("worm-alert")),
        ("send preview, every server", "POST", "/send/preview", preview_form("status")),
        ("events list", "GET", "/events/", None),
        ("event page, 25k deliveries", "GET", f"/events/{event.pk}/", None),
    ]


RECENT_EVENTS = 300  # what the policy preview weighs (it reads at most 500)
BASELINE = ("baseline: login page", "GET", "/login/", None)
BENCH_USER = "bench-admin"
LIVE_RECEIVERS = 1_000


def load(servers: int):
    """The scenario with `servers` web servers (those missing only), its recent events
    and the alert with ~25,000 deliveries (returned), then fresh planner statistics:
    COPY leaves the tables unanalysed until autovacuum comes."""
    from django.core.management import call_command
    from django.db import connection

    from bench.console_events import progress_event

    call_command("collectstatic", interactive=False, verbosity=0)  # pages link to them
    load_scenario_keeping_keys(servers, FOLDER)
    publish_recent_events()
    started = time.monotonic()
    event = progress_event()
    print(
        f"set-up: event {event.pk} with {event.deliveries.count()} deliveries "
        f"in {time.monotonic() - started:.1f} s",
        flush=True,
    )
    started = time.monotonic()
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    print(f"set-up: ANALYZE in {time.monotonic() - started:.1f} s", flush=True)
    return event


def load_scenario_keeping_keys(servers: int, folder: Path) -> None:
    """The scenario with `servers` web servers, in bulk; when it is loaded now, its
    keys are kept in `folder`, beside the bench's own database."""
    from django.core.management import call_command

    keys_file = folder / KEYS_FILE_NAME
    call_command("load_scenario", servers=servers, bulk=True, keys_file=keys_file)


def forget_keys_of_a_dropped_database(folder: Path) -> None:
    """The keys kept beside the bench's database opened only that database: once it is
    dropped they open nothing, and the next load keeps its own there."""
    (folder / KEYS_FILE_NAME).unlink(missing_ok=True)


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

    from bench.services import logged_in_web_client
    from broker.audit import Actor
    from broker.services.operators import issue_operator_token

    user, _ = get_user_model().objects.get_or_create(
        username=BENCH_USER, defaults={"is_staff": True, "is_superuser": True}
    )
    bench = Actor("system", "bench")
    token = issue_operator_token(user=user, label="bench/console.py", actor=bench)
    return logged_in_web_client(user, HTTP_HOST="localhost", HTTP_AUTHORIZATION=f"Bearer {token}")


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
    return {
        "label": label,
        "status": response.status_code,
        "median": statistics.median(timings),
        "p95": p95(timings),
        "queries": len(queries),
    }


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))]


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


def measure_live(env: dict[str, str], user):
    """Issue 11's live updates: a fresh status command for LIVE_RECEIVERS servers,
    acknowledged while a reader watches its page (bench/console_live.py)."""
    from bench import console_live
    from bench.console_events import command_event, spread_receivers

    event = command_event(spread_receivers(LIVE_RECEIVERS))
    return console_live.measure_live(env, FOLDER / "web.log", user, event)


def report_live(live, budget_ms: float) -> bool:
    """Print the live latency and its baselines; whether its p95 is within the budget."""
    from bench.console_live import ACKS_PER_SECOND

    shown = [ms for ms in live.shown_ms if ms is not None]
    missing = len(live.shown_ms) - len(shown)
    print(f"{'':>32}  {'median':>9}  {'p95':>9}  {'max':>9}")
    rows = [
        ("live: ack shown on event page", shown or [float("inf")]),
        ("baseline: announcement to socket", live.layer_ms),
        ("baseline: socket ping round trip", live.ping_ms),
    ]
    for label, values in rows:
        print(
            f"{label:>32}  {statistics.median(values):6.1f} ms  {p95(values):6.1f} ms  "
            f"{max(values):6.1f} ms"
        )
    over = missing > 0 or p95(rows[0][1]) > budget_ms
    print(
        f"live: {len(live.shown_ms)} acks paced at {ACKS_PER_SECOND}/s took {live.acks_s:.1f} s, "
        f"{live.refreshes} page refreshes, {missing} never shown{'  OVER BUDGET' if over else ''}"
    )
    return not over


def run(args, env: dict[str, str]) -> bool:
    import django

    if fresh_database(env, keep=args.reuse):
        forget_keys_of_a_dropped_database(FOLDER)
    os.environ.update(env)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    django.setup()
    from django.contrib.auth import get_user_model

    from broker.models import Client

    event = load(args.servers)
    clients = Client.objects.count()
    print(f"console: {clients} clients, {args.runs} runs a request after {WARM_UPS} warm-ups")
    client = logged_in_client()
    started = time.monotonic()
    send(client, "GET", "/fleet/", None)
    print(f"the directory of {clients} clients built in {time.monotonic() - started:.1f} s")
    baseline = measure(client, BASELINE, args.runs)
    requests = REQUESTS + event_requests(event)
    results = [measure(client, request, args.runs) for request in requests]
    ok = report(results, baseline, args.budget_ms)
    if not args.no_live:
        live = measure_live(env, get_user_model().objects.get(username=BENCH_USER))
        ok = report_live(live, args.live_budget_ms) and ok
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.console", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--servers", type=int, default=100_000, help="web servers to load")
    parser.add_argument("--runs", type=int, default=20, help="timed runs per request")
    parser.add_argument("--budget-ms", type=float, default=500.0, help="highest median allowed")
    parser.add_argument("--reuse", action="store_true", help="keep the loaded database")
    parser.add_argument(
        "--live-budget-ms", type=float, default=1000.0, help="highest live p95 allowed"
    )
    parser.add_argument("--no-live", action="store_true", help="skip the live updates")
    run_in_process(run, parser.parse_args(), FOLDER)


if __name__ == "__main__":
    main()
