"""Every change of an attribute value is kept, by a trigger whoever writes it, so that a
client's attributes and policy can be read as they were at any past moment."""

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from broker.audit import Actor
from broker.models import AttributeHistory, AttributeValue, Client
from broker.reads.history import attributes_as_of, policy_as_of
from broker.services.authorities import attest_attributes, revoke_attestation
from broker.services.clients import state_attributes
from broker.services.policies import set_policy
from broker.services.trust import renew_for_clients, revoke_for_clients
from demo.scenario import bulk_add_web_servers, load_scenario

pytestmark = pytest.mark.django_db(databases=["default", "audit"])
OFFICER = Actor("user", "trudy")


@pytest.fixture
def scenario():
    return load_scenario(servers=2)


def history(client: Client, name: str) -> list[tuple]:
    rows = AttributeHistory.objects.filter(client=client, name=name).order_by("at", "id")
    return list(rows.values_list("kind", "value", "source", "authority__name"))


def state(client: Client, **values) -> None:
    state_attributes(client=client, values=values, actor=Actor("client", client.name))


def attest_region(scenario, server: Client, region: str, **expiry) -> None:
    grant = scenario.grants[(server.name, scenario.inventory.name)]
    attest_attributes(
        authority=scenario.inventory,
        client=server,
        grant_key=grant,
        values={"region": region},
        **expiry,
    )


def test_values_the_services_state_and_attest_are_recorded_with_their_provenance(scenario):
    server = scenario.servers[0]
    state(server, load=0.9)
    attest_region(scenario, server, "Southeast")
    assert history(server, "load")[-1] == ("set", 0.9, "client", None)
    assert history(server, "region") == [
        ("set", "Northwest", "authority", "macrocorp-inventory"),  # load_scenario's
        ("set", "Southeast", "authority", "macrocorp-inventory"),
    ]


def test_a_renewal_and_a_revocation_by_the_trust_officer_are_recorded(scenario):
    controller = scenario.controllers["rogue-controller"]
    until = timezone.now() + timedelta(days=30)
    renew_for_clients(
        authority=scenario.trust_manager,
        clients=[controller],
        names=["trust"],
        expires_at=until,
        actor=OFFICER,
    )
    revoke_for_clients(
        authority=scenario.trust_manager, clients=[controller], names=["trust"], actor=OFFICER
    )
    kinds = AttributeHistory.objects.filter(client=controller, name="trust").order_by("at", "id")
    assert [(row.kind, row.value, row.expires_at) for row in kinds] == [
        ("set", 1, None),
        ("renewed", 1, until),
        ("revoked", 1, until),
    ]
    assert kinds.last().revoked_by == str(OFFICER)


def test_servers_copied_in_bulk_are_recorded_too(scenario):
    bulk_add_web_servers(6)
    added = Client.objects.filter(name__in=["web-00002", "web-00005"])
    values = AttributeValue.objects.filter(client__in=added)
    recorded = AttributeHistory.objects.filter(client__in=added)
    assert values.count() == recorded.count() == 2 * 7
    assert set(recorded.values_list("kind", flat=True)) == {"set"}
    by_name = {(r.client_id, r.name): (r.value, r.source, r.set_at) for r in recorded}
    assert by_name == {(v.client_id, v.name): (v.value, v.source, v.set_at) for v in values}


def test_a_write_that_changes_nothing_that_matters_is_not_recorded(scenario):
    server = scenario.servers[0]
    before = AttributeHistory.objects.count()
    AttributeValue.objects.filter(client=server).update(revoked_by="")
    assert AttributeHistory.objects.count() == before


def test_attributes_as_of_a_moment_ignore_later_changes(scenario):
    server = scenario.servers[0]
    registered = timezone.now()
    state(server, load=0.93)
    attest_region(scenario, server, "Southeast")
    then = attributes_as_of(server, registered)
    assert then["load"].value != 0.93 and then["region"].value == "Northwest"
    assert then["region"].authority == "macrocorp-inventory" and then["region"].attested
    assert then["software"].source == "client" and then["software"].authority is None
    now = attributes_as_of(server, timezone.now())
    assert (now["load"].value, now["region"].value) == (0.93, "Southeast")


def test_nothing_is_held_before_it_was_set(scenario):
    before_everything = timezone.now() - timedelta(days=1)
    assert attributes_as_of(scenario.servers[0], before_everything) == {}


def test_an_expired_value_is_not_held_after_its_expiry(scenario):
    server = scenario.servers[1]
    expires_at = timezone.now() + timedelta(hours=1)
    attest_region(scenario, server, "Southwest", expires_at=expires_at)
    held = attributes_as_of(server, expires_at - timedelta(seconds=1))["region"]
    assert (held.value, held.expires_at) == ("Southwest", expires_at)
    assert "region" not in attributes_as_of(server, expires_at)


def test_a_revoked_value_is_held_until_its_revocation_only(scenario):
    controller = scenario.controllers["northwest-controller"]
    before = timezone.now()
    revoke_attestation(authority=scenario.trust_manager, client=controller, names=["trust"])
    assert attributes_as_of(controller, before)["trust"].value == 2
    assert "trust" not in attributes_as_of(controller, timezone.now())


def test_a_renewed_value_is_held_until_its_new_expiry(scenario):
    server = scenario.servers[1]
    first = timezone.now() + timedelta(hours=1)
    attest_region(scenario, server, "Southwest", expires_at=first)
    later = first + timedelta(days=1)
    renew_for_clients(
        authority=scenario.inventory,
        clients=[server],
        names=["region"],
        expires_at=later,
        actor=OFFICER,
    )
    assert attributes_as_of(server, first + timedelta(hours=1))["region"].expires_at == later


def test_the_policy_as_of_a_moment_is_the_version_then(scenario):
    server = scenario.servers[0]
    first = policy_as_of(server, timezone.now())
    set_policy(client=server, text='accept event.kind == "command"', actor=Actor("user", "p"))
    assert policy_as_of(server, timezone.now()).version == first.version + 1
    assert policy_as_of(server, first.created_at).version == first.version
    assert policy_as_of(server, first.created_at - timedelta(seconds=1)) is None


def test_the_history_is_kept_by_a_trigger_no_writer_can_forget():
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT tgname FROM pg_trigger WHERE tgrelid = 'broker_attributevalue'::regclass "
            "AND NOT tgisinternal ORDER BY tgname"
        )
        names = [row[0] for row in cursor.fetchall()]
    assert names == ["attribute_history_on_insert", "attribute_history_on_update"]
