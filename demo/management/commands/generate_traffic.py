"""Generate a synthetic incident's traffic, at any scale (demo.synthetic)."""

from datetime import UTC, datetime, timedelta

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from demo.synthetic import NothingToDeliver, Request, Written, demo_loaded, generate_traffic

DEFAULT_SERVERS = 100_000
DEFAULT_CONTROLLERS = 12
DEFAULT_DELIVERIES = 1_000_000
MAX_SERVERS = 1_000_000
MAX_CONTROLLERS = 400
MAX_DELIVERIES = 1_000_000_000
DEFAULT_AGO = timedelta(hours=3)
MIN_AGO = timedelta(minutes=10)
# The demo: a small incident over the scenario's fleet as it is.
DEMO_DELIVERIES = 400
DEMO_CONTROLLERS = 4
OPTIONS = (
    ("--servers", f"web servers in the fleet, added up to this many (default {DEFAULT_SERVERS})"),
    ("--controllers", f"controllers beyond the scenario's three (default {DEFAULT_CONTROLLERS})"),
    ("--deliveries", f"delivery records to write (default {DEFAULT_DELIVERIES})"),
)


class Command(BaseCommand):
    help = (
        "Write a synthetic two-hour worm incident through the service's tables: events, "
        "deliveries, hops, policy and trust changes, audit entries."
    )

    def add_arguments(self, parser):
        for option, says in OPTIONS:
            parser.add_argument(option, type=int, help=says)
        parser.add_argument("--start", help="when the incident began, ISO 8601 (default: 3 h ago)")
        parser.add_argument("--seed", type=int, default=1, help="same seed, same incident")
        parser.add_argument(
            "--no-ack-audit", action="store_true", help="skip the audit entry of each answer"
        )
        parser.add_argument(
            "--demo", action="store_true", help="a small incident over the fleet, loaded once"
        )

    def handle(self, *args, **options):
        if options["demo"] and demo_loaded():
            self.stdout.write("The demo's incident is loaded already: nothing to do.")
            return
        request = _demo_request(options) if options["demo"] else _request(options)
        try:
            written = generate_traffic(request)
        except NothingToDeliver as error:
            raise CommandError(str(error)) from None
        self.stdout.write(self.style.SUCCESS(_summary(written)))


def _request(options: dict) -> Request:
    return Request(
        deliveries=_within("deliveries", options, DEFAULT_DELIVERIES, 1, MAX_DELIVERIES),
        start=_start(options["start"]),
        servers=_within("servers", options, DEFAULT_SERVERS, 1, MAX_SERVERS),
        controllers=_within("controllers", options, DEFAULT_CONTROLLERS, 0, MAX_CONTROLLERS),
        seed=options["seed"],
        audit_answers=not options["no_ack_audit"],
    )


def _demo_request(options: dict) -> Request:
    if options["servers"] is not None or options["deliveries"] is not None:
        raise CommandError(
            "--demo makes a small incident of its own: give it no --servers or --deliveries"
        )
    return Request(
        deliveries=DEMO_DELIVERIES,
        start=_start(options["start"]),
        controllers=_within("controllers", options, DEMO_CONTROLLERS, 0, MAX_CONTROLLERS),
        seed=options["seed"],
        audit_answers=not options["no_ack_audit"],
        demo=True,
    )


def _within(name: str, options: dict, default: int, low: int, high: int) -> int:
    value = default if options[name] is None else options[name]
    if not low <= value <= high:
        raise CommandError(f"--{name} must be between {low:,} and {high:,} (got {value:,})")
    return value


def _start(text: str | None) -> datetime:
    now = timezone.now()
    if text is None:
        return now - DEFAULT_AGO
    try:
        start = datetime.fromisoformat(text)
    except ValueError:
        raise CommandError(
            f"--start must be an ISO 8601 date and time, e.g. 2026-11-23T08:00:00Z (got {text!r})"
        ) from None
    start = start if start.tzinfo else start.replace(tzinfo=UTC)
    if start > now - MIN_AGO:
        minutes = MIN_AGO // timedelta(minutes=1)
        raise CommandError(f"--start must be at least {minutes} minutes ago (got {text})")
    return start


def _summary(written: Written) -> str:
    added = ""
    if written.servers_added or written.controllers_added:
        added = (
            f" (fleet: added {written.servers_added:,} web servers, "
            f"{written.controllers_added} controllers)"
        )
    return (
        f"Wrote {written.events:,} events, {written.deliveries:,} deliveries, "
        f"{written.hops:,} hops, {written.audit_entries:,} audit entries (besides one per "
        f"answer), {written.policy_versions:,} policy versions{added} in "
        f"{written.seconds:.1f} s (deliveries and their answers' audit: "
        f"{written.delivery_seconds:.1f} s)."
    )
