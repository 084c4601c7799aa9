"""Synthetic incident traffic, at any scale, through the service's own tables.

`generate_traffic` writes what the service would have written during a two-hour worm
incident: controllers and a fleet of web servers (grown to the size asked), events
from the controllers and from an operator acting for them (commands, alerts, reports,
some refused, some resent to who did not answer), their hops through the dispatcher
tree, deliveries with their confirmations, answers, failures and silence, the
streams' and channels' counters, policy and trust changes, and the audit log of all
of it (refusals with their category). The reports and the benchmark read it; the demo
keeps a small one loaded (`generate_demo`).

Everything is written by COPY, the deliveries in blocks of receivers: ten million in
a few minutes on two cores (see deliveries.py).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, fields
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from broker import audit as service_audit
from broker.audit import Actor
from broker.models import AuditEntry
from broker.vocabulary import vocabulary
from demo.synthetic.cast import add_controllers, ensure_scenario, grow_fleet
from demo.synthetic.changes import (
    plan_attribute_changes,
    write_attribute_changes,
    write_policy_changes,
)
from demo.synthetic.deliveries import DeliveryWriter
from demo.synthetic.incident import Incident
from demo.synthetic.incidentals import write_incidentals
from demo.synthetic.moves import Cast
from demo.synthetic.plan import NothingToDeliver, Planned, Planner, World, plan_events
from demo.synthetic.policies import PolicyTimeline, plan_policy_changes
from demo.synthetic.records import AuditRows, number_events, write_events, write_hops
from demo.synthetic.roster import Fleet, Sender, Tree, read_senders
from demo.synthetic.routing import Router
from lifecycle.partitions import ensure_partitions

__all__ = ["NothingToDeliver", "Request", "Written", "demo_loaded", "generate_traffic"]

GENERATOR = Actor("system", "generator")
REGISTERED_BEFORE = timedelta(days=2)  # the fleet and the controllers, before the incident
WRITTEN_TABLES = ("broker_event", "broker_delivery", "broker_trafficrecord", "broker_auditentry")


@dataclass(frozen=True)
class Request:
    """What to generate: `deliveries` delivery records of an incident that began at
    `start`, by a fleet of at least `servers` web servers (None: the fleet as it is)
    and `controllers` regional controllers beyond the scenario's."""

    deliveries: int
    start: datetime
    servers: int | None = None
    controllers: int = 12
    seed: int = 1
    audit_answers: bool = True
    demo: bool = False
    # ANALYZE what it wrote; a loader of many runs does it once at the end instead:
    # a partitioned table's ANALYZE reads every day's partition, the older ones too.
    analyze: bool = True


@dataclass
class Written:
    """What a run wrote, and how long it took."""

    servers_added: int = 0
    controllers_added: int = 0
    events: int = 0
    deliveries: int = 0
    hops: int = 0
    audit_entries: int = 0
    policy_versions: int = 0
    tokens: int = 0
    seconds: float = 0.0
    delivery_seconds: float = 0.0

    def as_details(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def demo_loaded() -> bool:
    """Whether the demo's incident was generated in this database already."""
    return AuditEntry.objects.filter(action="traffic.generate", details__demo=True).exists()


def generate_traffic(request: Request) -> Written:
    """Write the incident `request` asks for (see the module's docstring)."""
    started = time.monotonic()
    written = Written()
    ensure_scenario()
    registered_at = request.start - REGISTERED_BEFORE
    if request.servers:
        written.servers_added = grow_fleet(request.servers, registered_at=registered_at)
    extra, written.controllers_added = add_controllers(
        request.controllers, registered_at=registered_at
    )
    rng = random.Random(request.seed)
    # The days it writes have their partitions before the first COPY (rows a default
    # partition took would be moved again, one day at a time): from the incident's
    # start to its last event's expiry, a week at most later.
    day = request.start.date()
    ensure_partitions(first=day - timedelta(days=1), last=day + timedelta(days=8))
    world = _world(Incident.beginning(request.start, timezone.now()), extra, rng)
    events = plan_events(Planner(world, rng), request.deliveries)
    with transaction.atomic():
        _write_incident(world, events, rng, written)
    delivering = time.monotonic()
    writer = DeliveryWriter(
        events, world.fleet, world.fates, world.incident.now, rng.getrandbits(64)
    )
    written.deliveries = writer.write(audit_answers=request.audit_answers)
    written.delivery_seconds = time.monotonic() - delivering
    if request.analyze:
        _analyze()
    written.seconds = time.monotonic() - started
    _record_run(request, written)
    return written


def _world(incident: Incident, extra: list[str], rng: random.Random) -> World:
    fleet = Fleet.read()
    if not fleet.receivers:
        raise NothingToDeliver("the fleet has no receiver attached to the tree with a policy")
    senders, words = read_senders(), vocabulary()
    regions: dict[str | None, list[int]] = {}
    for receiver in fleet.receivers:
        regions.setdefault(dict(receiver.attributes).get("region"), []).append(receiver.id)
    fates = incident.fates(regions, rng)
    timeline = PolicyTimeline(fleet.groups, plan_policy_changes(incident, fleet.groups, words))
    changes = plan_attribute_changes(incident, senders, extra)
    return World(
        incident, fleet, senders, _cast(senders, extra, fleet), words, timeline, changes, fates
    )


def _cast(senders: dict[str, Sender], extra: list[str], fleet: Fleet) -> Cast:
    def regional(name: str) -> bool:
        return senders[name].attributes.get("scope") == "regional"

    northwest = [
        name for name, sender in senders.items()
        if regional(name) and sender.attributes.get("region") == "Northwest"
        and sender.attributes.get("trust", 0) >= 2
    ]  # fmt: skip
    others: dict[str, list[str]] = {}
    for name in extra:
        region = senders[name].attributes.get("region")
        if region and region != "Northwest":
            others.setdefault(region, []).append(name)
    profiles = [group.attributes for group in fleet.groups]
    weights = [len(group.members) for group in fleet.groups]
    return Cast(northwest, others, profiles, weights)


def _write_incident(
    world: World, events: list[Planned], rng: random.Random, written: Written
) -> None:
    audit = AuditRows()
    number_events(events)
    router = Router(Tree.read(), world.fleet.groups, rng)
    for event in events:
        event.route = router.route(event, audit)
        if event.send.operator:
            _audit_send(event, router, audit)
    write_events(events)
    written.events = len(events)
    written.hops = write_hops(events)
    written.policy_versions = write_policy_changes(world.policies.changes, world.fleet, audit)
    write_attribute_changes(world.attribute_changes, world.senders, audit)
    written.tokens = write_incidentals(
        world.incident, world.fleet, world.fates, len(events), audit, rng
    )
    written.audit_entries = audit.write()


def _audit_send(event: Planned, router: Router, audit: AuditRows) -> None:
    """As broker.services.sending records an operator's send (the reach it previewed)."""
    audience, groups = event.audience, router.groups
    addressed = sum(
        audience.reached(groups[index], leaf)
        for index in audience.verdicts
        for leaf in groups[index].by_leaf
    )
    names, refusing = router.refusing_names(audience, router.tree.topology.leaves)
    confirmed = audience.count > settings.SEND_CONFIRM_ABOVE
    details = {
        "as": event.sender.name,
        "selector": event.send.selector,
        "addressed": addressed,
        "accepting": audience.count,
        "refused_by": {"names": names, "unlisted": refusing - len(names)},
        "confirmed_by": event.send.operator if confirmed else None,
        "confirmed_count": audience.count if confirmed else None,
    }
    if event.resend_of is not None:
        details["resend_of"] = str(event.resend_of.id)
    audit.change(event.at, event.send.sent_by, "event.send", event.target, details)


def _analyze() -> None:
    """Fresh statistics for the tables just grown (their next readers plan by them)."""
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {', '.join(WRITTEN_TABLES)}")


def _record_run(request: Request, written: Written) -> None:
    details = {
        **written.as_details(),
        "seed": request.seed,
        "demo": request.demo,
        "start": request.start.isoformat(),
        "deliveries_asked": request.deliveries,
    }
    service_audit.record_change(
        actor=GENERATOR,
        action="traffic.generate",
        target=f"events:{written.events}",
        details=details,
    )
