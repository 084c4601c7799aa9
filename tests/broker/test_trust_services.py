"""A trust officer manages authorities (keys, state, capabilities) and attests, renews
and revokes for many clients at once on an authority's behalf: only where the client's
grant stands and the authority may set the value, all in one transaction, audited."""

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from broker.audit import Actor
from broker.credentials import key_digest
from broker.dispatch import entry
from broker.errors import AuthenticationFailed, InvalidInput, NotAuthorised
from broker.models import AttestationGrant, AuditEntry, Client, ClientChange, ModelAttribute
from broker.reads.clients import attested_attributes
from broker.reads.trust import clients_granting
from broker.services.authorities import (
    authenticate_authority,
    grant_authority,
    rotate_authority_key,
    set_authority_active,
    set_capabilities,
)
from broker.services.trust import (
    attest_for_clients,
    plan_attestation,
    plan_renewal,
    plan_revocation,
    renew_for_clients,
    revoke_for_clients,
)
from demo.scenario import load_scenario

pytestmark = pytest.mark.django_db(databases=["default", "audit"])
OFFICER = Actor("user", "trudy")
SCALE_CLIENTS = 10_000


@pytest.fixture
def scenario():
    # Nothing here commits, so nothing is routed: the tests stop at the change log.
    return load_scenario(servers=4)


def refusals(action: str) -> list[AuditEntry]:
    entries = AuditEntry.objects.using("audit").filter(action=action, outcome="refused")
    return list(entries.order_by("id"))


def changes(action: str) -> list[AuditEntry]:
    """The officer's changes (the scenario's own setup is audited too)."""
    entries = AuditEntry.objects.filter(action=action, outcome="done", actor=str(OFFICER))
    return list(entries.order_by("id"))


def in_days(days: float):
    return timezone.now() + timedelta(days=days)


# --- keys, state and capabilities -----------------------------------------------------


def test_rotating_a_key_stops_the_old_one_at_once_and_is_audited_without_the_key(scenario):
    trust = scenario.trust_manager
    old = scenario.secrets["trust-manager"]

    new = rotate_authority_key(authority=trust, actor=OFFICER)

    assert new.startswith("sna_") and new != old
    assert authenticate_authority(new) == trust
    with pytest.raises(AuthenticationFailed):
        authenticate_authority(old)
    trust.refresh_from_db()
    assert trust.key_hash == key_digest(new)
    (entry,) = changes("authority.rotate_key")
    assert (entry.actor, entry.target) == ("user:trudy", "authority:trust-manager")
    assert new not in str(entry.details) and key_digest(new) not in str(entry.details)


def test_a_disabled_authority_cannot_log_in_nor_be_attested_for_and_it_is_audited(scenario):
    trust = scenario.trust_manager
    controllers = list(scenario.controllers.values())

    set_authority_active(authority=trust, active=False, actor=OFFICER)

    with pytest.raises(AuthenticationFailed):
        authenticate_authority(scenario.secrets["trust-manager"])
    with pytest.raises(NotAuthorised):
        attest_for_clients(
            authority=trust, clients=controllers, values={"trust": 3}, expires_at=None,
            actor=OFFICER,
        )  # fmt: skip
    assert [r.details["field"] for r in refusals("attributes.attest")] == ["authority"]
    (entry,) = changes("authority.set_active")
    assert entry.details == {"before": True, "after": False}


def test_setting_capabilities_is_audited_with_before_and_after(scenario):
    inventory = scenario.inventory
    region = ModelAttribute.objects.get(model__name="web-server", name="region")

    set_capabilities(authority=inventory, capabilities=[region], actor=OFFICER)

    assert list(inventory.capabilities.all()) == [region]
    (entry,) = changes("authority.set_capabilities")
    assert entry.details == {
        "before": ["web-server.organization", "web-server.region"],
        "after": ["web-server.region"],
    }


# --- attesting in bulk ------------------------------------------------------------------


def test_a_plan_shows_each_change_and_each_refusal_and_writes_nothing(scenario):
    trust = scenario.trust_manager
    clients = [*scenario.controllers.values(), scenario.servers[0]]
    before = list(AuditEntry.objects.values_list("id", flat=True))

    plan = plan_attestation(
        authority=trust, clients=clients, values={"trust": 3}, expires_at=in_days(30)
    )

    assert plan.counts == {"clients": 4, "accepted": 3, "refused": 1}
    northwest = next(p for p in plan.clients if p.client == "northwest-controller")
    (change,) = northwest.changes
    assert (change.name, change.before, change.after) == ("trust", 2, 3)
    assert plan.refusals_by_reason() == {
        "no standing grant to trust-manager (never given, or revoked)": ["web-00000"]
    }
    assert attested_attributes(scenario.controllers["northwest-controller"])["trust"] == 2
    assert list(AuditEntry.objects.values_list("id", flat=True)) == before


def test_bulk_attestation_sets_only_granted_and_capable_clients_and_audits_the_refused(
    scenario,
):
    inventory = scenario.inventory
    servers, northwest = scenario.servers, scenario.controllers["northwest-controller"]
    # The controller consents, but the inventory may set region on web servers only.
    grant_authority(client=northwest, authority=inventory, actor=Actor("client", northwest.name))
    AttestationGrant.objects.filter(client=servers[3]).update(revoked_at=timezone.now())
    logged = ClientChange.objects.count()

    plan = attest_for_clients(
        authority=inventory, clients=[*servers, northwest], values={"region": "Southwest"},
        expires_at=None, actor=OFFICER,
    )  # fmt: skip

    assert plan.counts == {"clients": 5, "accepted": 3, "refused": 2}
    for server in servers[:3]:
        assert attested_attributes(server)["region"] == "Southwest"
    assert attested_attributes(servers[3])["region"] != "Southwest"
    assert attested_attributes(northwest)["region"] == "Northwest"
    (entry,) = changes("attributes.attest")
    assert entry.actor == "user:trudy" and entry.details["authority"] == "macrocorp-inventory"
    assert entry.details["values"] == {"region": "Southwest"} and entry.details["count"] == 3
    assert entry.details["clients"]["names"] == ["web-00000", "web-00001", "web-00002"]
    (refusal,) = refusals("attributes.attest")
    assert refusal.actor == "user:trudy" and refusal.reason.startswith("2 of 5 clients refused")
    assert refusal.details["refused"] == {
        "macrocorp-inventory may not set region on controller clients": {
            "names": ["northwest-controller"], "unlisted": 0,
        },
        "no standing grant to macrocorp-inventory (never given, or revoked)": {
            "names": ["web-00003"], "unlisted": 0,
        },
    }  # fmt: skip
    assert ClientChange.objects.count() == logged + 3


def test_a_value_of_the_wrong_type_is_refused_for_every_client_of_that_model(scenario):
    controllers = list(scenario.controllers.values())

    plan = attest_for_clients(
        authority=scenario.trust_manager, clients=controllers, values={"trust": "high"},
        expires_at=None, actor=OFFICER,
    )  # fmt: skip

    assert plan.counts["accepted"] == 0
    (reason,) = plan.refusals_by_reason()
    assert reason.startswith("trust ")
    assert [attested_attributes(c)["trust"] for c in controllers] == [2, 3, 1]
    assert not changes("attributes.attest")


def test_bulk_attestation_is_one_transaction_a_failure_mid_way_leaves_nothing(
    scenario, monkeypatch
):
    controllers = list(scenario.controllers.values())
    logged, audited = ClientChange.objects.count(), AuditEntry.objects.count()

    def fail(clients):
        list(clients)
        raise RuntimeError("the database went away")

    monkeypatch.setattr(entry, "clients_changed", fail)
    with pytest.raises(RuntimeError):
        attest_for_clients(
            authority=scenario.trust_manager, clients=controllers, values={"trust": 5},
            expires_at=None, actor=OFFICER,
        )  # fmt: skip

    assert [attested_attributes(c)["trust"] for c in controllers] == [2, 3, 1]
    assert (ClientChange.objects.count(), AuditEntry.objects.count()) == (logged, audited)


def test_input_that_is_wrong_whatever_the_client_is_refused_whole_and_audited(scenario):
    controllers = list(scenario.controllers.values())
    with pytest.raises(InvalidInput) as expired:
        attest_for_clients(
            authority=scenario.trust_manager, clients=controllers, values={"trust": 3},
            expires_at=in_days(-1), actor=OFFICER,
        )  # fmt: skip
    with pytest.raises(InvalidInput) as empty:
        plan_attestation(
            authority=scenario.trust_manager, clients=controllers, values={}, expires_at=None
        )
    assert (expired.value.field, empty.value.field) == ("expires_at", "values")
    assert [r.details["field"] for r in refusals("attributes.attest")] == ["expires_at"]


def test_the_plan_and_its_application_read_as_many_queries_for_100_clients_as_for_10():
    scenario = load_scenario(servers=100)
    inventory = scenario.inventory
    counts = []
    for size in (10, 100):
        clients = Client.objects.filter(pk__in=[s.pk for s in scenario.servers[:size]])
        with CaptureQueriesContext(connection) as planned:
            plan = plan_attestation(
                authority=inventory, clients=clients, values={"region": "Nowhere"},
                expires_at=None,
            )  # fmt: skip
        with CaptureQueriesContext(connection) as applied:
            attest_for_clients(
                authority=inventory, clients=clients, values={"region": "Nowhere"},
                expires_at=None, actor=OFFICER,
            )  # fmt: skip
        assert plan.counts["accepted"] == size
        counts.append((len(planned), len(applied)))
    assert counts[0] == counts[1], counts
    assert counts[0][0] <= 6


def test_ten_thousand_clients_are_attested_in_one_go(scenario):
    # How fast is the business of bench/console.py; this says that it works at scale.
    controllers = granting_controllers(scenario, SCALE_CLIENTS)
    trust = scenario.trust_manager

    plan = attest_for_clients(
        authority=trust, clients=clients_granting(trust), values={"trust": 2, "scope": "local"},
        expires_at=in_days(90), actor=OFFICER,
    )  # fmt: skip

    assert plan.counts["accepted"] == SCALE_CLIENTS + len(scenario.controllers)
    assert ClientChange.objects.filter(client__in=controllers).count() == SCALE_CLIENTS


def granting_controllers(scenario, count: int) -> list[Client]:
    """`count` controllers that granted the trust manager, written in bulk (registering
    them one by one through the services would take minutes)."""
    leaf = scenario.controllers["northwest-controller"].dispatcher
    clients = Client.objects.bulk_create(
        Client(name=f"ctl-{i:05d}", model=scenario.controller_model, can_send=True,
               can_receive=False, secret_hash="-", dispatcher=leaf)
        for i in range(count)
    )  # fmt: skip
    AttestationGrant.objects.bulk_create(
        AttestationGrant(client=c, authority=scenario.trust_manager, key_hash=f"scale-{c.pk}")
        for c in clients
    )
    return clients


# --- renewing and revoking ----------------------------------------------------------------


def test_renewal_extends_the_expiry_keeps_the_values_and_logs_the_changes(scenario):
    trust, controllers = scenario.trust_manager, list(scenario.controllers.values())
    soon, later = in_days(1), in_days(60)
    attest_for_clients(
        authority=trust, clients=controllers, values={"trust": 2}, expires_at=soon,
        actor=OFFICER,
    )  # fmt: skip
    logged = ClientChange.objects.count()

    preview = plan_renewal(authority=trust, clients=controllers, names=["trust"], expires_at=later)
    renewed = renew_for_clients(
        authority=trust, clients=controllers, names=None, expires_at=later, actor=OFFICER
    )

    (change,) = preview.clients[0].changes
    assert (change.before, change.after, change.expires_before) == (2, 2, soon)
    assert renewed.counts == {"clients": 3, "accepted": 3, "refused": 0}
    northwest = scenario.controllers["northwest-controller"]
    assert attested_attributes(northwest, now=in_days(30)) == {
        "organization": "Government", "scope": "regional", "region": "Northwest", "trust": 2,
    }  # fmt: skip
    assert set(northwest.attribute_values.values_list("expires_at", flat=True)) == {later}
    assert ClientChange.objects.count() == logged + 3
    assert changes("attributes.renew")[0].details["expires_at"] == later.isoformat()


def test_renewal_refuses_clients_with_nothing_attested_or_no_grant(scenario):
    trust = scenario.trust_manager
    northwest, server = scenario.controllers["northwest-controller"], scenario.servers[0]
    revoke_for_clients(authority=trust, clients=[northwest], names=["trust"], actor=OFFICER)

    plan = plan_renewal(
        authority=trust, clients=[northwest, server], names=["trust"], expires_at=in_days(9)
    )

    assert plan.refusals_by_reason() == {
        "nothing to renew: trust-manager has no value of trust standing": ["northwest-controller"],
        "no standing grant to trust-manager (never given, or revoked)": ["web-00000"],
    }


def test_revocation_marks_the_values_revoked_and_logs_a_change_per_client(scenario):
    inventory, servers = scenario.inventory, scenario.servers
    logged = ClientChange.objects.count()

    preview = plan_revocation(authority=inventory, clients=servers, names=["region"])
    plan = revoke_for_clients(
        authority=inventory, clients=Client.objects.filter(model__name="web-server"),
        names=["region"], actor=OFFICER,
    )  # fmt: skip

    assert preview.counts == plan.counts == {"clients": 4, "accepted": 4, "refused": 0}
    assert preview.clients[0].changes[0].before == "Northwest"
    for server in servers:
        value = server.attribute_values.get(name="region")
        assert value.revoked_at is not None
        assert "region" not in attested_attributes(server)
        assert attested_attributes(server)["organization"] == "Macrocorp"
    assert ClientChange.objects.count() == logged + 4
    (entry,) = changes("attributes.revoke")
    assert entry.details["names"] == ["region"] and entry.details["count"] == 4


# --- never beyond the authority's capabilities -----------------------------------------


def test_no_path_makes_a_value_attested_by_an_authority_that_lacks_the_capability(scenario):
    inventory, trust = scenario.inventory, scenario.trust_manager
    servers, controllers = scenario.servers, list(scenario.controllers.values())
    for controller in controllers:
        grant_authority(client=controller, authority=inventory, actor=Actor("client", "c"))

    # A self-stated attribute of a granting client, and another model's attribute.
    hostname = attest_for_clients(
        authority=inventory, clients=servers, values={"hostname": "evil"}, expires_at=None,
        actor=OFFICER,
    )  # fmt: skip
    trust_level = attest_for_clients(
        authority=inventory, clients=controllers, values={"trust": 3}, expires_at=None,
        actor=OFFICER,
    )  # fmt: skip
    # A plan previewed while the capability stood is planned again when applied.
    stale = plan_attestation(
        authority=trust, clients=controllers, values={"trust": 3}, expires_at=None
    )
    set_capabilities(authority=trust, capabilities=[], actor=OFFICER)
    applied = attest_for_clients(
        authority=trust, clients=controllers, values={"trust": 3}, expires_at=None, actor=OFFICER
    )
    renewed = renew_for_clients(
        authority=trust, clients=controllers, names=None, expires_at=None, actor=OFFICER
    )

    assert stale.counts["accepted"] == 3
    for plan in (hostname, trust_level, applied, renewed):
        assert plan.counts["accepted"] == 0, plan.refusals_by_reason()
    assert {s.attribute_values.get(name="hostname").source for s in servers} == {"client"}
    assert [attested_attributes(c)["trust"] for c in controllers] == [2, 3, 1]
    assert not changes("attributes.attest") and not changes("attributes.renew")
