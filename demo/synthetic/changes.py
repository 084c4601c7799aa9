"""The incident's changes besides its events, written as the services write them:
policies saved for groups of servers, a controller's trust lowered and restored by
the trust officer, a controller's region revoked and attested again by the trust
manager (AttributeValue writes; its trigger keeps the history), and every changed
client logged for its leaf."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from django.db import connection

from broker.dispatch import entry
from broker.models import AttributeValue, Authority, Client, PolicyVersion
from demo.bulk import copy_rows
from demo.synthetic.clock import to_datetime
from demo.synthetic.incident import Incident
from demo.synthetic.policies import POLICY_AUTHOR, PolicyChange
from demo.synthetic.records import AuditRows, listed
from demo.synthetic.roster import Fleet, Receiver, Sender

TRUST_OFFICER = "user:trevor"
TRUST_MANAGER = "trust-manager"


@dataclass(frozen=True)
class AttributeChange:
    """Attested values of a sender set (or, with `revoked`, revoked) at `at`, through
    the trust page by the trust officer or through the API by the authority."""

    at: int
    sender: str
    values: dict = field(default_factory=dict)
    revoked: tuple[str, ...] = ()
    by_officer: bool = False


def plan_attribute_changes(
    incident: Incident, senders: dict[str, Sender], extra: list[str]
) -> list[AttributeChange]:
    """A Northwest controller's trust lowered to 1 and restored; another region's
    controller's region revoked and attested again. Only the added controllers are
    touched, never the scenario's."""
    northwest = [n for n in extra if senders[n].attributes.get("region") == "Northwest"]
    others = [n for n in extra if n not in northwest and "region" in senders[n].attributes]
    changes = []
    trust = northwest and senders[northwest[-1]].attributes.get("trust")
    if trust:
        victim = northwest[-1]
        changes += [
            AttributeChange(incident.at(0.4), victim, {"trust": 1}, by_officer=True),
            AttributeChange(incident.at(0.8), victim, {"trust": trust}, by_officer=True),
        ]
    if others:
        victim, region = others[0], senders[others[0]].attributes["region"]
        changes += [
            AttributeChange(incident.at(0.5), victim, revoked=("region",)),
            AttributeChange(incident.at(0.7), victim, {"region": region}),
        ]
    return sorted(changes, key=lambda change: change.at)


def attributes_at(sender: Sender, changes: list[AttributeChange], moment: int) -> dict:
    """The sender's attested attributes at `moment`."""
    values = dict(sender.attributes)
    for change in changes:
        if change.sender == sender.name and change.at <= moment:
            values.update(change.values)
            for name in change.revoked:
                values.pop(name, None)
    return values


UPSERT_ATTESTED = f"""
INSERT INTO {AttributeValue._meta.db_table}
    (client_id, name, value, source, authority_id, set_at, expires_at, revoked_at, revoked_by)
VALUES (%s, %s, %s::jsonb, 'authority', %s, %s, NULL, NULL, '')
ON CONFLICT (client_id, name) DO UPDATE SET
    value = EXCLUDED.value, source = EXCLUDED.source, authority_id = EXCLUDED.authority_id,
    set_at = EXCLUDED.set_at, expires_at = NULL, revoked_at = NULL, revoked_by = ''
"""
REVOKE_ATTESTED = f"""
UPDATE {AttributeValue._meta.db_table} SET revoked_at = %s, revoked_by = %s
WHERE client_id = %s AND name = %s AND authority_id = %s AND revoked_at IS NULL
"""


def write_attribute_changes(changes, senders: dict[str, Sender], audit: AuditRows) -> None:
    """Each change in time order, one statement per value (the history trigger dates
    each at its set_at or revoked_at), audited as its service audits it."""
    authority = Authority.objects.get(name=TRUST_MANAGER).pk
    with connection.cursor() as cursor:
        for change in changes:
            sender = senders[change.sender]
            moment = to_datetime(change.at)
            for name, value in change.values.items():
                cursor.execute(
                    UPSERT_ATTESTED, [sender.id, name, json.dumps(value), authority, moment]
                )
            for name in change.revoked:
                cursor.execute(
                    REVOKE_ATTESTED,
                    [moment, f"authority:{TRUST_MANAGER}", sender.id, name, authority],
                )
            _audit_attribute_change(change, audit)
    entry.clients_changed(Client(pk=s.id, dispatcher_id=s.leaf) for s in senders.values()
                          if any(c.sender == s.name for c in changes))  # fmt: skip


def _audit_attribute_change(change: AttributeChange, audit: AuditRows) -> None:
    target = f"client:{change.sender}"
    if change.by_officer:  # broker.services.trust: one entry for the plan's clients
        details = {"authority": TRUST_MANAGER, "values": change.values, "expires_at": None,
                   "count": 1, "clients": listed([change.sender])}  # fmt: skip
        audit.change(change.at, TRUST_OFFICER, "attributes.attest", "clients:1", details)
    elif change.revoked:  # broker.services.authorities.revoke_attestation
        details = {"names": list(change.revoked), "revoked": len(change.revoked)}
        audit.change(change.at, f"authority:{TRUST_MANAGER}", "attributes.revoke", target, details)
    else:  # broker.services.authorities.attest_attributes
        details = {"values": change.values, "expires_at": None}
        audit.change(change.at, f"authority:{TRUST_MANAGER}", "attributes.attest", target, details)


POLICY_FIELDS = ["client", "version", "text", "canonical_text", "created_at", "created_by"]


def write_policy_changes(changes: list[PolicyChange], fleet: Fleet, audit: AuditRows) -> int:
    """New policy versions for the selected receivers, one audit entry per change (as
    set_policies writes them); returns how many versions."""
    versions = {r.id: r.policy_version for r in fleet.receivers}
    rows, changed = [], {}
    for change in changes:
        members = [r for g in sorted(change.groups) for r in fleet.groups[g].members]
        moment = to_datetime(change.at)
        for receiver in members:
            versions[receiver.id] += 1
            rows.append((receiver.id, versions[receiver.id], change.text, change.canonical,
                         moment, POLICY_AUTHOR))  # fmt: skip
            changed[receiver.id] = receiver
        _audit_policy(change, members, audit)
    copy_rows(PolicyVersion, POLICY_FIELDS, rows)
    entry.clients_changed(Client(pk=r.id, dispatcher_id=r.leaf) for r in changed.values())
    return len(rows)


def _audit_policy(change: PolicyChange, receivers: list[Receiver], audit: AuditRows) -> None:
    names = sorted(r.name for r in receivers)
    details = {"policy": change.canonical, "selection": change.selection, "clients": listed(names)}
    audit.change(change.at, POLICY_AUTHOR, "policy.set", f"clients:{len(names)}", details)
