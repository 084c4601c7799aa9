"""The worm-response scenario of docs/scenario.md as data: models, authorities, controllers,
web servers and their policy. The demo loads it; the tests play it out."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from sn_agent.signatures import public_key_text

from auditchain.keys import audit_key, make_audit_key
from broker import audit, seals
from broker.attributes import check_values
from broker.audit import Actor
from broker.credentials import key_digest, new_secret
from broker.dispatch import entry
from broker.models import (
    AttestationGrant,
    AttributeValue,
    Authority,
    Client,
    ClientModel,
    PolicyVersion,
)
from broker.reads.sending import send_templates
from broker.services.authorities import attest_attributes, create_authority, grant_authority
from broker.services.clients import (
    AttributeSpec,
    create_client_model,
    register_client,
    state_attributes,
)
from broker.services.event_attributes import EventAttributeSpec, declare_event_attributes
from broker.services.policies import canonical_policy, set_policy
from broker.services.sending import Draft, save_send_template
from broker.services.signing_keys import make_authority_key, make_sender_key
from broker.services.tree import spread_over_leaves
from demo.bulk import copy_rows

SETUP = Actor("system", "scenario")
TRUST_MANAGER = "trust-manager"

WEB_SERVER_POLICY = """\
# Macrocorp web servers
accept
    (sender.organization == "Intellimune" and sender.scope == "national"
     and event.kind == "command")
 or (event.alert exists and event.threat_level >= 4
     and sender.region == "Northwest" and sender.trust >= 2)
"""

WEB_SERVER_ATTRIBUTES = [
    AttributeSpec("hostname", "string"),
    AttributeSpec("software", "string"),
    AttributeSpec("version", "version"),
    AttributeSpec("cgi", "bool"),
    AttributeSpec("load", "float"),
    AttributeSpec("region", "string", self_stated=False),
    AttributeSpec("organization", "string", self_stated=False),
]
# Receivers qualify senders only by attested attributes, so everything a policy tests
# about a controller is reserved for the trust manager.
CONTROLLER_ATTRIBUTES = [
    AttributeSpec("organization", "string", self_stated=False),
    AttributeSpec("scope", "string", self_stated=False),
    AttributeSpec("region", "string", self_stated=False),
    AttributeSpec("trust", "int", self_stated=False),
]
# What the scenario's events carry and its policies test. `version` is text, not a
# version: the worm alert names the vulnerable versions with a glob, "2.4.*".
EVENT_ATTRIBUTES = [
    EventAttributeSpec("kind", "string", "alert or command"),
    EventAttributeSpec("alert", "string", "the threat an alert is about, e.g. worm"),
    EventAttributeSpec("threat_level", "int", "1 (low) to 5 (critical)"),
    EventAttributeSpec("target", "string", "the software under threat"),
    EventAttributeSpec("version", "string", "the versions under threat, a glob: 2.4.*"),
    EventAttributeSpec("action", "string", "what a command asks: disable-cgi, shutdown, status"),
]
REGIONS = ("Northwest", "Northeast", "Southwest", "Southeast")
SOFTWARE = (
    ("IIS", ("2.4.1", "2.4.7", "2.5.0", "3.0.2")),
    ("Apache", ("2.4.57", "2.4.62")),
    ("nginx", ("1.24.0", "1.26.1")),
)
CONTROLLERS = {
    "northwest-controller": {
        "organization": "Government",
        "scope": "regional",
        "region": "Northwest",
        "trust": 2,
    },
    "intellimune-national": {
        "organization": "Intellimune",
        "scope": "national",
        "region": "National",
        "trust": 3,
    },
    "rogue-controller": {
        "organization": "Government",
        "scope": "regional",
        "region": "Northwest",
        "trust": 1,
    },
}


WORM_ALERT = {
    "kind": "alert",
    "alert": "worm",
    "threat_level": 4,
    "target": "IIS",
    "version": "2.4.*",
}
VULNERABLE = 'software == "IIS" and version ~ "2.4.*" and cgi == true'
OVERLOADED = 'software == "IIS" and version ~ "2.4.*" and load >= 0.8'


@dataclass(frozen=True)
class SendTemplate:
    """One of the scenario's sends, offered ready-made on the console's Send page once
    the scenario is loaded (`offer_send_templates`)."""

    slug: str
    title: str
    sender: str
    content: dict
    selector: str
    lifetime_s: int
    channel: str


SEND_TEMPLATES = (
    SendTemplate(
        "worm-alert",
        "Worm alert to the Northwest",
        "northwest-controller",
        WORM_ALERT,
        'region == "Northwest"',
        600,
        "alerts",
    ),
    SendTemplate(
        "disable-cgi",
        "Disable CGI on vulnerable IIS servers",
        "intellimune-national",
        {"kind": "command", "action": "disable-cgi"},
        VULNERABLE,
        300,
        "commands",
    ),
    SendTemplate(
        "shutdown",
        "Standing shutdown of overloaded vulnerable servers (10 minutes)",
        "intellimune-national",
        {"kind": "command", "action": "shutdown"},
        OVERLOADED,
        600,
        "commands",
    ),
    SendTemplate(
        "status",
        "Status report from every web server",
        "intellimune-national",
        {"kind": "command", "action": "status"},
        "",
        120,
        "commands",
    ),
)


@dataclass
class Scenario:
    """Handles to the scenario's cast; secrets are kept only for the demo and tests."""

    web_server_model: ClientModel
    controller_model: ClientModel
    inventory: Authority
    trust_manager: Authority
    controllers: dict[str, Client] = field(default_factory=dict)
    servers: list[Client] = field(default_factory=list)
    secrets: dict[str, str] = field(default_factory=dict)
    grants: dict[tuple[str, str], str] = field(default_factory=dict)


def demo_keys(scenario: Scenario) -> dict:
    """What the demo keeps so that the attestation API can be tried at once: each
    authority's key and the grant keys of the clients that granted it, by client."""
    authorities = {}
    for authority in (scenario.trust_manager, scenario.inventory):
        grants = {
            client: key for (client, granted), key in scenario.grants.items()
            if granted == authority.name
        }  # fmt: skip
        authorities[authority.name] = {"key": scenario.secrets[authority.name], "grants": grants}
    return {"api": "/api/v1/clients/NAME/attestations", "authorities": authorities}


def ensure_signing_keys() -> list[str]:
    """With SIGNING_KEYS_DIR set (./run sets it), make sure the console holds the trust
    manager's key and each controller's, so that operators' sends are signed and the
    demo's fleet, which verifies, acts on them (docs/security.md). What was made."""
    if not settings.SIGNING_KEYS_DIR:
        return []
    made = []
    trust_manager = Authority.objects.get(name=TRUST_MANAGER)
    if seals.private_key(seals.AUTHORITIES, trust_manager.name) is None:
        make_authority_key(authority=trust_manager, actor=SETUP)
        made.append(trust_manager.name)
    for controller in Client.objects.filter(name__in=CONTROLLERS).order_by("name"):
        key = seals.private_key(seals.SENDERS, controller.name)
        if key is None or public_key_text(key.public_key()) != controller.signing_key:
            make_sender_key(client=controller, actor=SETUP)
            made.append(controller.name)
    if audit_key() is None:  # the audit chain's checkpoints are signed with it
        make_audit_key()
        made.append("the console's audit key")
    return made


def trusted_authorities() -> dict[str, list[str]] | None:
    """The [trust] authorities of the demo's fleet: the trust manager's public key, if
    the console holds its private key (None: the fleet does not verify)."""
    key = seals.private_key(seals.AUTHORITIES, TRUST_MANAGER)
    return None if key is None else {TRUST_MANAGER: [public_key_text(key.public_key())]}


def server_attributes(index: int, rng: random.Random) -> tuple[dict, dict]:
    """(self-stated, inventory-attested) attributes of the index-th web server."""
    software, versions = SOFTWARE[index % len(SOFTWARE)]
    stated = {
        "hostname": f"web-{index:05d}",
        "software": software,
        "version": versions[(index // len(SOFTWARE)) % len(versions)],
        "cgi": index % 4 != 1,
        "load": round(rng.uniform(0.05, 0.75), 2),
    }
    attested = {"region": REGIONS[index % len(REGIONS)], "organization": "Macrocorp"}
    return stated, attested


@transaction.atomic
def load_scenario(*, servers: int = 40, seed: int = 7) -> Scenario:
    """Create the scenario's models, authorities, controllers and `servers` servers,
    and, once it has servers to address, offer its ready-made sends (their selectors are
    typed by the receivers' models in use: with none, by nothing)."""
    scenario = _create_cast()
    for name, values in CONTROLLERS.items():
        _add_controller(scenario, name, values)
    rng = random.Random(seed)
    for index in range(servers):
        _add_server(scenario, *server_attributes(index, rng))
    if scenario.servers:
        offer_send_templates()
    return scenario


def offer_send_templates() -> list[str]:
    """Offer the scenario's ready-made sends on the console's Send page, those it does
    not offer yet (one put in place since is left as it is); their slugs. The console
    reads them from the service, as any site's own: the scenario is not its rule."""
    offered = {template.slug for template in send_templates()}
    senders = {client.name: client for client in Client.objects.filter(name__in=CONTROLLERS)}
    made = []
    for template in SEND_TEMPLATES:
        if template.slug not in offered:
            draft = Draft(
                sender=senders[template.sender], content=template.content,
                selector=template.selector, lifetime_s=template.lifetime_s,
                channel=template.channel,
            )  # fmt: skip
            save_send_template(slug=template.slug, title=template.title, draft=draft, actor=SETUP)
            made.append(template.slug)
    return made


def _create_cast() -> Scenario:
    web = create_client_model(name="web-server", attributes=WEB_SERVER_ATTRIBUTES, actor=SETUP)
    controller = create_client_model(
        name="controller", attributes=CONTROLLER_ATTRIBUTES, actor=SETUP
    )
    inventory, inventory_key = create_authority(
        name="macrocorp-inventory",
        display_name="Macrocorp inventory",
        capabilities=web.attributes.filter(name__in=["region", "organization"]),
        actor=SETUP,
    )
    trust, trust_key = create_authority(
        name=TRUST_MANAGER,
        display_name="Regulated trust manager",
        capabilities=controller.attributes.all(),
        actor=SETUP,
    )
    declare_event_attributes(attributes=EVENT_ATTRIBUTES, actor=SETUP)
    scenario = Scenario(web, controller, inventory, trust)
    scenario.secrets.update({inventory.name: inventory_key, trust.name: trust_key})
    return scenario


def _add_controller(scenario: Scenario, name: str, values: dict) -> None:
    client, secret = register_client(
        name=name, model=scenario.controller_model, can_send=True, can_receive=False, actor=SETUP
    )
    grant = grant_authority(
        client=client, authority=scenario.trust_manager, actor=Actor("client", name)
    )
    attest_attributes(
        authority=scenario.trust_manager, client=client, grant_key=grant, values=values
    )
    scenario.controllers[name] = client
    scenario.secrets[name] = secret
    scenario.grants[(name, scenario.trust_manager.name)] = grant


def _add_server(scenario: Scenario, stated: dict, attested: dict) -> None:
    name = stated["hostname"]
    client, secret = register_client(
        name=name, model=scenario.web_server_model, can_send=False, can_receive=True, actor=SETUP
    )
    actor = Actor("client", name)
    state_attributes(client=client, values=stated, actor=actor)
    grant = grant_authority(client=client, authority=scenario.inventory, actor=actor)
    attest_attributes(authority=scenario.inventory, client=client, grant_key=grant, values=attested)
    set_policy(client=client, text=WEB_SERVER_POLICY, actor=actor)
    scenario.servers.append(client)
    scenario.secrets[name] = secret
    scenario.grants[(name, scenario.inventory.name)] = grant


def ensure_web_servers(count: int, *, seed: int = 7) -> list[tuple[Client, dict]]:
    """The scenario's first `count` web servers, with the values each states about
    itself; the missing ones are registered as load_scenario would have (same names,
    same values for the same seed). The scenario must have been loaded."""
    scenario = _existing_cast()
    rng = random.Random(seed)
    names = [f"web-{index:05d}" for index in range(count)]
    existing = {c.name: c for c in Client.objects.filter(name__in=names)}
    servers = []
    for index in range(count):
        stated, attested = server_attributes(index, rng)
        client = existing.get(stated["hostname"])
        if client is None:
            with transaction.atomic():
                _add_server(scenario, stated, attested)
            client = scenario.servers[-1]
        servers.append((client, stated))
    return servers


def _existing_cast() -> Scenario:
    return Scenario(
        web_server_model=ClientModel.objects.get(name="web-server"),
        controller_model=ClientModel.objects.get(name="controller"),
        inventory=Authority.objects.get(name="macrocorp-inventory"),
        trust_manager=Authority.objects.get(name=TRUST_MANAGER),
    )


BULK_CHUNK = 10_000  # web servers per transaction, and per audit entry


@dataclass(frozen=True)
class _BulkCast:
    """What every bulk-added web server shares, read once."""

    model_id: int
    inventory_id: int
    declared: dict[str, str]
    canonical_policy: str


def bulk_add_web_servers(
    count: int, *, seed: int = 7, chunk: int = BULK_CHUNK, registered_at: datetime | None = None
) -> int:
    """Add those of the scenario's first `count` web servers that do not exist yet, as
    ensure_web_servers would (same names, values and provenance, policy, grant to the
    inventory, leaves, a ClientChange each), with COPY instead of the services: 100,000
    in about a minute on two cores. `chunk` servers per transaction, each chunk audited
    as one change by the system. Their secrets and grant keys are thrown away
    (issue_fleet_tokens gives tokens). They are registered, and their values set, at
    `registered_at` (default: now; synthetic traffic registers them before its
    incident). The scenario must have been loaded. Returns how many servers were added."""
    cast = _existing_cast()
    shared = _BulkCast(
        model_id=cast.web_server_model.pk,
        inventory_id=cast.inventory.pk,
        declared=dict(cast.web_server_model.attributes.values_list("name", "type")),
        canonical_policy=canonical_policy(WEB_SERVER_POLICY),
    )
    missing = _missing_servers(count, seed)
    for start in range(0, len(missing), chunk):
        with transaction.atomic():
            _bulk_add_chunk(shared, missing[start : start + chunk], registered_at)
    return len(missing)


def _missing_servers(count: int, seed: int) -> list[tuple[dict, dict]]:
    rng = random.Random(seed)
    # Each index draws from rng: server i's values need those of 0..i-1 drawn first.
    servers = [server_attributes(index, rng) for index in range(count)]
    names = Client.objects.filter(name__startswith="web-").values_list("name", flat=True)
    existing = set(names)
    return [server for server in servers if server[0]["hostname"] not in existing]


def _bulk_add_chunk(
    shared: _BulkCast, servers: list[tuple[dict, dict]], registered_at: datetime | None
) -> None:
    names = [stated["hostname"] for stated, _ in servers]
    leaves = dict(zip(names, spread_over_leaves(len(names)), strict=True))
    now = registered_at or timezone.now()
    client_fields = ["name", "model", "can_send", "can_receive", "secret_hash", "dispatcher"]
    copy_rows(
        Client,
        [*client_fields, "is_active", "created_at"],
        (
            (name, shared.model_id, False, True, key_digest(new_secret("sns")), leaf, True, now)
            for name, leaf in leaves.items()
        ),
    )
    ids = dict(Client.objects.filter(name__in=names).values_list("name", "id"))
    copy_rows(
        AttributeValue,
        ["client", "name", "value", "source", "authority", "set_at"],
        _value_rows(shared, ids, servers, now),
    )
    _copy_grants_and_policies(shared, ids, now)
    entry.clients_changed(Client(pk=ids[name], dispatcher_id=leaf) for name, leaf in leaves.items())
    audit.record_change(
        actor=SETUP,
        action="scenario.add_web_servers",
        target=f"clients:{len(names)}",
        details={"first": names[0], "last": names[-1], "servers": len(names)},
    )


def _value_rows(shared: _BulkCast, ids: dict, servers: list, now) -> Iterator[tuple]:
    """Rows of AttributeValue: stated by the server, or attested by the inventory."""
    stated_by, attested_by = AttributeValue.Source.CLIENT, AttributeValue.Source.AUTHORITY
    for stated, attested in servers:
        client_id = ids[stated["hostname"]]
        for source, authority, values in (
            (stated_by, None, stated),
            (attested_by, shared.inventory_id, attested),
        ):
            # Stored as the services store them: checked against the declared types.
            for name, value in check_values(shared.declared, values).items():
                yield client_id, name, json.dumps(value), source, authority, now


def _copy_grants_and_policies(shared: _BulkCast, ids: dict, now) -> None:
    copy_rows(
        AttestationGrant,
        ["client", "authority", "key_hash", "created_at"],
        ((pk, shared.inventory_id, key_digest(new_secret("sng")), now) for pk in ids.values()),
    )
    copy_rows(
        PolicyVersion,
        ["client", "version", "text", "canonical_text", "created_at", "created_by"],
        # By the server itself, as load_scenario's servers set their own policies.
        (
            (pk, 1, WEB_SERVER_POLICY, shared.canonical_policy, now, f"client:{name}")
            for name, pk in ids.items()
        ),
    )
