"""Who takes part: the scenario, its fleet grown to the size asked, and regional
controllers beyond the scenario's three, registered before the incident (by COPY, as
the services would have: client, grant to the trust manager, attested values, token,
audit entries, a change logged for its leaf)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction

from broker.attributes import check_values
from broker.credentials import key_digest, new_secret
from broker.dispatch import entry
from broker.models import (
    AttestationGrant,
    AttributeValue,
    Authority,
    Client,
    ClientModel,
    ClientToken,
)
from broker.services.tree import spread_over_leaves
from demo.bulk import copy_rows
from demo.scenario import REGIONS, bulk_add_web_servers, load_scenario
from demo.synthetic.clock import MINUTE, US, to_datetime, to_us
from demo.synthetic.moves import OPERATOR
from demo.synthetic.records import AuditRows

REGISTRAR = "user:adam"  # the console's administrator registers controllers
TRUST_MANAGER = "trust-manager"


def ensure_scenario() -> bool:
    """Load the scenario unless it is; whether it was loaded now."""
    if ClientModel.objects.filter(name="web-server").exists():
        return False
    load_scenario()
    return True


def grow_fleet(servers: int, *, registered_at: datetime) -> int:
    """Web servers up to `servers` (the scenario's, by COPY); how many were added."""
    return bulk_add_web_servers(servers, registered_at=registered_at)


def controller(index: int) -> tuple[str, dict]:
    """The index-th added controller: a regional one, the first of each region
    trusted a little more."""
    region = REGIONS[index % len(REGIONS)]
    number = index // len(REGIONS) + 1
    values = {"organization": "Government", "scope": "regional", "region": region,
              "trust": 3 if number == 1 else 2}  # fmt: skip
    return f"controller-{region.lower()}-{number}", values


def add_controllers(count: int, *, registered_at: datetime) -> tuple[list[str], int]:
    """The first `count` added controllers, registering those missing; (their names,
    how many were registered now)."""
    wanted = dict(controller(index) for index in range(count))
    existing = set(Client.objects.filter(name__in=list(wanted)).values_list("name", flat=True))
    missing = {name: values for name, values in wanted.items() if name not in existing}
    if missing:
        with transaction.atomic():
            _register(missing, to_us(registered_at))
    return list(wanted), len(missing)


def _register(controllers: dict[str, dict], at: int) -> None:
    model = ClientModel.objects.get(name="controller")
    authority = Authority.objects.get(name=TRUST_MANAGER)
    leaves = dict(zip(controllers, spread_over_leaves(len(controllers)), strict=True))
    # One a minute, each: registered, granted, attested, given a token, a second apart.
    times = {name: at + offset * MINUTE for offset, name in enumerate(controllers)}
    copy_rows(
        Client,
        ["name", "model", "can_send", "can_receive", "secret_hash", "dispatcher", "is_active",
         "created_at"],
        ((name, model.pk, True, False, key_digest(new_secret("sns")), leaves[name], True,
          to_datetime(times[name]))
         for name in controllers),
    )  # fmt: skip
    ids = dict(Client.objects.filter(name__in=list(controllers)).values_list("name", "id"))
    declared = dict(model.attributes.values_list("name", "type"))
    _copy_trust(controllers, ids, authority.pk, declared, times)
    audit = AuditRows()
    for name, values in controllers.items():
        _audit_registration(audit, name, check_values(declared, values), times[name])
    audit.write()
    entry.clients_changed(Client(pk=ids[name], dispatcher_id=leaves[name]) for name in controllers)


def _copy_trust(controllers: dict, ids: dict, authority: int, declared: dict, times) -> None:
    """Grants to the trust manager, its attested values, and a token each."""

    def moment(name: str, seconds: int) -> datetime:
        return to_datetime(times[name] + seconds * US)

    copy_rows(
        AttestationGrant,
        ["client", "authority", "key_hash", "created_at"],
        ((ids[name], authority, key_digest(new_secret("sng")), moment(name, 1))
         for name in controllers),
    )  # fmt: skip
    copy_rows(
        AttributeValue,
        ["client", "name", "value", "source", "authority", "set_at"],
        ((ids[name], attribute, json.dumps(value), AttributeValue.Source.AUTHORITY, authority,
          moment(name, 2))
         for name, values in controllers.items()
         for attribute, value in check_values(declared, values).items()),
    )  # fmt: skip
    lifetime = timedelta(days=settings.CLIENT_TOKEN_DAYS)
    copy_rows(
        ClientToken,
        ["client", "key_hash", "created_at", "expires_at"],
        (
            (ids[name], key_digest(new_secret("snt")), moment(name, 3), moment(name, 3) + lifetime)
            for name in controllers
        ),
    )


def _audit_registration(audit: AuditRows, name: str, values: dict, at: int) -> None:
    target, actor = f"client:{name}", f"client:{name}"
    audit.change(at, REGISTRAR, "client.register", target)
    audit.change(at + US, actor, "grant.create", target, {"authority": TRUST_MANAGER})
    audit.change(at + 2 * US, f"authority:{TRUST_MANAGER}", "attributes.attest", target,
                 {"values": values, "expires_at": None})  # fmt: skip
    audit.change(at + 3 * US, f"user:{OPERATOR}", "client.issue_token", target)
