"""A small worm incident (docs/scenario.md) played through the real service, then exported:
what the report jobs' tests read. Everything is written by the services a real incident
goes through (publishing, the tree, agents confirming and answering, the expiry, policy
and trust changes, refusals), so the dataset has the shapes production data has.

The cast's behaviour is fixed, so tests can name it; the figures the tests check are
computed from the database, never taken from here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from broker.audit import Actor
from broker.errors import BrokerError
from broker.models import Client, Delivery, Event
from broker.services.authorities import attest_attributes, revoke_attestation
from broker.services.clients import state_attributes
from broker.services.deliveries import acknowledge_delivery, confirm_receipt, expire_unconfirmed
from broker.services.events import publish_event
from broker.services.policies import set_policy
from broker.services.sending import Draft, grant_sending, preview_send, send_as
from demo.scenario import OVERLOADED, VULNERABLE, WORM_ALERT, Scenario, load_scenario
from reports.export import export_changes
from reports.results import Params
from reports.spark import Dataset
from tests.broker.tree_helpers import wait_until_idle
from tests.cast import ADMINISTRATOR, OPERATOR, create_member

# What a test module using the incident needs (committed data; its fixtures start the
# worker and Spark, which puts it in the full tier).
INCIDENT_MARKS = [pytest.mark.django_db(transaction=True, databases=["default", "audit"])]
# What a test of the module-wide incident (fixture `incident`) needs: it only reads.
READING_MARKS = [pytest.mark.django_db(databases=["default", "audit"])]

SERVERS = 40
# Never confirm anything (so: no answer while an event lives, expired after).
SILENT = ("web-00005", "web-00010", "web-00039")
# Confirm that they have a delivery, and never answer it.
RECEIVED_ONLY = ("web-00027", "web-00008")
# Answer "failed" (with the result their agent reported).
FAILING = ("web-00015", "web-00007")
# Edits its policy during the incident to accept alerts only: misses the status command.
ALERTS_ONLY = "web-00002"
ALERTS_ONLY_POLICY = """\
# alerts only, during the incident
accept event.alert exists and event.threat_level >= 4
"""
# The status command expires during the incident, once routed to every server (a
# machine busy with other tests may take seconds to route it).
STATUS_LIFETIME_S = 6
WINDOW_MARGIN = timedelta(minutes=30)


@dataclass
class Incident:
    """The incident as played, and its export. `params` covers the whole incident with
    a margin (an hour's window: one-minute buckets for the timeline)."""

    scenario: Scenario
    spark: object
    root: Path
    events: dict[str, Event]
    started: datetime
    ended: datetime
    data: Dataset | None = None
    params: Params | None = None
    operators: dict = field(default_factory=dict)

    def export(self) -> Dataset:
        """Export what changed since the last export; the dataset as it now is."""
        wait_until_idle()
        export_changes()
        self.data = Dataset(self.spark, self.root, keep=True)
        return self.data


def play_incident(*, spark, root: Path) -> Incident:
    """Play the incident through the services, export it to `root`, and return it."""
    started = timezone.now()
    scenario = load_scenario(servers=SERVERS)
    wait_until_idle()
    incident = Incident(scenario, spark, root, {}, started, started)
    _alerts(incident)
    _disable_cgi(incident)
    _standing_shutdown(incident)
    _policy_and_trust_changes(incident)
    _status_report(incident)
    incident.ended = timezone.now()
    incident.params = Params(
        window_start=started - WINDOW_MARGIN, window_end=started + WINDOW_MARGIN
    )
    incident.export()
    return incident


def server(name: str) -> Client:
    return Client.objects.get(name=name)


def _alerts(incident: Incident) -> None:
    """The Northwest alert (confirmed by every Northwest server that is not silent,
    answered by most), and the trust-1 controller's forged alert, refused everywhere."""
    controllers = incident.scenario.controllers
    alert = _publish(controllers["northwest-controller"], WORM_ALERT, 'region == "Northwest"')
    incident.events["alert"] = alert
    _answer(alert, ok_except=(*RECEIVED_ONLY, "web-00004"))
    incident.events["rogue_alert"] = _publish(
        controllers["rogue-controller"], WORM_ALERT, 'region == "Northwest"'
    )


def _disable_cgi(incident: Incident) -> None:
    national = incident.scenario.controllers["intellimune-national"]
    command = _publish(national, {"kind": "command", "action": "disable-cgi"}, VULNERABLE, 300)
    incident.events["disable_cgi"] = command
    _answer(command)


def _standing_shutdown(incident: Incident) -> None:
    """The standing shutdown: two vulnerable servers (and one Apache, which it does not
    concern) cross the load threshold while it lives and get it, once."""
    national = incident.scenario.controllers["intellimune-national"]
    shutdown = _publish(national, {"kind": "command", "action": "shutdown"}, OVERLOADED, 600)
    incident.events["shutdown"] = shutdown
    for name in ("web-00000", "web-00024", "web-00001"):
        state_attributes(client=server(name), values={"load": 0.93}, actor=_client(name))
    wait_until_idle()
    _answer(shutdown)


def _policy_and_trust_changes(incident: Incident) -> None:
    """A policy edit, an attestation, a revocation, and a refused self-stated region."""
    scenario = incident.scenario
    paula = Actor("user", "paula")
    set_policy(client=server(ALERTS_ONLY), text=ALERTS_ONLY_POLICY, actor=paula)
    northwest = scenario.controllers["northwest-controller"]
    attest_attributes(
        authority=scenario.trust_manager,
        client=northwest,
        grant_key=scenario.grants[(northwest.name, scenario.trust_manager.name)],
        values={"trust": 3},
    )
    rogue = scenario.controllers["rogue-controller"]
    revoke_attestation(authority=scenario.trust_manager, client=rogue, names=["trust"])
    with pytest.raises(BrokerError):
        state_attributes(
            client=server("web-00001"), values={"region": "Northwest"}, actor=_client("web-00001")
        )
    wait_until_idle()


def _status_report(incident: Incident) -> None:
    """The status command, sent by an operator from the console as the national
    controller, short-lived: the silent servers' deliveries expire unconfirmed."""
    create_member(ADMINISTRATOR)
    olivia = create_member(OPERATOR)
    national = incident.scenario.controllers["intellimune-national"]
    grant_sending(client=national, holder=olivia, actor=Actor("user", ADMINISTRATOR.username))
    draft = Draft(
        sender=national,
        content={"kind": "command", "action": "status"},
        lifetime_s=STATUS_LIFETIME_S,
        channel="commands",
    )
    reach = preview_send(user=olivia, draft=draft)
    status = send_as(user=olivia, draft=draft, confirmed_count=reach.accepting, code_is_fresh=True)
    incident.events["status"] = status
    wait_until_idle()
    _answer(status)
    _sleep_until(status.expires_at)
    expire_unconfirmed()


def _publish(sender: Client, content: dict, selector: str, lifetime_s: int = 600) -> Event:
    channel = "alerts" if "alert" in content else "commands"
    event = publish_event(
        sender=sender, content=content, selector=selector, lifetime_s=lifetime_s, channel=channel
    )
    wait_until_idle()
    return event


def _answer(event: Event, *, ok_except: tuple[str, ...] = RECEIVED_ONLY) -> None:
    """Every receiver's agent but the silent ones confirms the event (and with it what
    came before); then they answer, in name order, but `ok_except` and FAILING."""
    deliveries = list(
        Delivery.objects.filter(event=event).select_related("receiver").order_by("receiver__name")
    )
    for delivery in deliveries:
        name = delivery.receiver.name
        if name not in SILENT:
            position = delivery.position
            confirm_receipt(client=delivery.receiver, position=position, actor=_client(name))
    for delivery in deliveries:
        name = delivery.receiver.name
        if name in SILENT or name in ok_except:
            continue
        failed = name in FAILING
        acknowledge_delivery(
            client=delivery.receiver,
            delivery_id=delivery.pk,
            status="failed" if failed else "ok",
            result={"error": "permission denied"} if failed else {"done": True},
            actor=_client(name),
        )


def _client(name: str) -> Actor:
    return Actor("client", name)


def _sleep_until(moment: datetime) -> None:
    remaining = (moment - timezone.now()).total_seconds()
    if remaining > 0:
        time.sleep(remaining + 0.05)
