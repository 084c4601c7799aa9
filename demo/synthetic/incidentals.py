"""What else an incident leaves in the audit log: operators refused by role on the
console, clients stating attributes only an authority may set, a forged sender
attribute, a mistyped send confirmation, and silent servers coming back (a failed login
with a stale secret, then a new token from the operator)."""

from __future__ import annotations

import random
from datetime import timedelta

from django.conf import settings

from broker.audit import ATTRIBUTE_NOT_AUTHORISED, OTHER, ROLE_REFUSED
from broker.credentials import key_digest, new_secret
from broker.models import ClientToken
from broker.roles import ATTEST, AUTHOR_POLICIES, MANAGE_CLIENTS, SEND, role_needed_for
from demo.bulk import copy_rows
from demo.synthetic.clock import US, to_datetime
from demo.synthetic.incident import Fate, Incident
from demo.synthetic.moves import NATIONAL, OPERATOR, ROGUE
from demo.synthetic.records import AuditRows
from demo.synthetic.roster import Fleet

# (operator, audited action, path, permission lacked): console.access.refuse's entries.
ROLE_ATTEMPTS = (
    ("audrey", "event.send", "/send/go", SEND),
    ("paula", "trust.apply", "/trust/apply", ATTEST),
    ("olivia", "policy.set", "/policies/save", AUTHOR_POLICIES),
    ("audrey", "fleet.bulk_action", "/fleet/actions", MANAGE_CLIENTS),
)
RESERVED = "region may only be set by an authority, not stated by the client itself"
FORGED = (
    "content may not carry 'sender.trust': the sender's attributes come from its "
    "attestations, never from the event"
)
MAX_RETURNING = 40  # silent servers whose return is audited


def write_incidentals(
    incident: Incident, fleet: Fleet, fates: dict[int, Fate], scale: int, audit: AuditRows,
    rng: random.Random,
) -> int:  # fmt: skip
    """Audit entries in proportion to `scale` (the incident's events); returns how many
    tokens were issued."""
    _role_refusals(incident, max(3, scale // 25), audit, rng)
    _reserved_attributes(incident, fleet, max(2, scale // 50), audit, rng)
    _forged_attributes(incident, max(1, scale // 100), audit, rng)
    _mistyped_confirmations(incident, max(1, scale // 60), audit, rng)
    return _returning_servers(incident, fleet, fates, audit, rng)


def _role_refusals(incident: Incident, count: int, audit: AuditRows, rng) -> None:
    for _ in range(count):
        user, action, path, permission = rng.choice(ROLE_ATTEMPTS)
        reason = f"{user} lacks the {role_needed_for(permission)} role ({permission})"
        details = {"method": "POST", "category": ROLE_REFUSED}
        audit.refusal(incident.at(rng.random()), f"user:{user}", action, path, reason, details)


def _reserved_attributes(incident: Incident, fleet: Fleet, count: int, audit, rng) -> None:
    """A misconfigured agent states its region itself (broker.services.clients)."""
    for _ in range(count):
        receiver = rng.choice(fleet.receivers)
        region = dict(receiver.attributes).get("region", "Northwest")
        attempted = {"region": region, "load": round(rng.uniform(0.1, 0.9), 2)}
        details = {"attempted": attempted, "field": "region", "category": ATTRIBUTE_NOT_AUTHORISED}
        actor = f"client:{receiver.name}"
        audit.refusal(
            incident.at(rng.random()), actor, "attributes.state", actor, RESERVED, details
        )


def _forged_attributes(incident: Incident, count: int, audit: AuditRows, rng) -> None:
    """The rogue controller tries to raise its trust inside the event (services.events)."""
    actor = f"client:{ROGUE}"
    for _ in range(count):
        details = {"channel": "alerts", "field": "content.sender.trust",
                   "category": ATTRIBUTE_NOT_AUTHORISED}  # fmt: skip
        audit.refusal(incident.at(rng.random()), actor, "event.publish", actor, FORGED, details)


def _mistyped_confirmations(incident: Incident, count: int, audit: AuditRows, rng) -> None:
    for _ in range(count):
        reaching = rng.randint(100, 5000)
        typed = reaching + rng.choice((-10, -1, 1, 100))
        reason = (
            f"you typed {typed}, but this reaches {reaching} receivers: type {reaching} to confirm"
        )
        details = {"field": "confirm", "category": OTHER}
        audit.refusal(incident.at(rng.random()), f"user:{OPERATOR}", "event.send",
                      f"client:{NATIONAL}", reason, details)  # fmt: skip


def _returning_servers(incident, fleet: Fleet, fates: dict[int, Fate], audit, rng) -> int:
    """Servers back from silence within the incident: the stale secret refused, a token
    issued by the operator, then they confirm what they missed."""
    back = [
        r for r in fleet.receivers if (f := fates.get(r.id)) and f.back and f.back < incident.end
    ]
    tokens = []
    for receiver in rng.sample(back, min(MAX_RETURNING, len(back))):
        moment, target = fates[receiver.id].back, f"client:{receiver.name}"
        details = {"category": OTHER}
        audit.refusal(moment - rng.randint(30, 120) * US, target, "client.login", target,
                      "unknown client or wrong secret", details)  # fmt: skip
        issued = moment - rng.randint(5, 25) * US
        audit.change(issued, f"user:{OPERATOR}", "client.issue_token", target)
        issued_at = to_datetime(issued)
        expires_at = issued_at + timedelta(days=settings.CLIENT_TOKEN_DAYS)
        tokens.append((receiver.id, key_digest(new_secret("snt")), issued_at, expires_at))
    copy_rows(ClientToken, ["client", "key_hash", "created_at", "expires_at"], tokens)
    return len(tokens)
