"""Web servers added in bulk (COPY) are the servers the services would have registered."""

import pytest
from django.core.management import call_command

from broker.credentials import key_digest
from broker.models import AuditEntry, Client, ClientChange, Dispatcher
from demo.scenario import bulk_add_web_servers, ensure_web_servers, load_scenario

pytestmark = pytest.mark.django_db(databases=["default", "audit"])

SERVERS = 9


def provenance(value) -> tuple:
    authority = value.authority and value.authority.name
    return value.value, value.source, authority, value.expires_at, value.revoked_at


def snapshot(client: Client) -> dict:
    """Everything about a server that must not depend on how it was registered."""
    return {
        "model": client.model.name,
        "flags": (client.can_send, client.can_receive, client.is_active),
        "leaf": client.dispatcher.name,
        "values": {
            value.name: provenance(value)
            for value in client.attribute_values.select_related("authority")
        },
        "policies": list(
            client.policy_versions.values_list("version", "text", "canonical_text", "created_by")
        ),
        "grants": list(client.grants.values_list("authority__name", "revoked_at")),
    }


def web_servers() -> dict[str, dict]:
    return {c.name: snapshot(c) for c in Client.objects.filter(name__startswith="web-")}


@pytest.fixture
def cast():
    return load_scenario(servers=0)


def test_bulk_servers_equal_the_servers_the_services_register(cast):
    ensure_web_servers(SERVERS)
    registered = web_servers()
    # Back to the same leaf loads, so that attach_to_leaf's spread can be compared too.
    Client.objects.filter(name__startswith="web-").delete()

    assert bulk_add_web_servers(SERVERS) == SERVERS

    assert web_servers() == registered
    assert len(registered) == SERVERS


def test_every_bulk_server_logs_a_change_for_its_leaf_and_has_a_digested_secret(cast):
    bulk_add_web_servers(SERVERS)

    for client in Client.objects.filter(name__startswith="web-"):
        assert client.dispatcher.is_leaf
        assert ClientChange.objects.filter(client=client, dispatcher=client.dispatcher).exists()
        assert len(client.secret_hash) == len(key_digest("x"))


def test_bulk_servers_are_spread_evenly_over_the_leaves(cast):
    bulk_add_web_servers(SERVERS * 4, chunk=7)

    loads = [leaf.clients.count() for leaf in Dispatcher.objects.filter(is_leaf=True)]
    assert max(loads) - min(loads) <= 1


def test_each_chunk_is_audited_as_one_change_by_the_system(cast):
    bulk_add_web_servers(5, chunk=2)

    entries = AuditEntry.objects.filter(action="scenario.add_web_servers").order_by("id")
    assert [(e.actor, e.details["first"], e.details["last"]) for e in entries] == [
        ("system:scenario", "web-00000", "web-00001"),
        ("system:scenario", "web-00002", "web-00003"),
        ("system:scenario", "web-00004", "web-00004"),
    ]


def test_running_it_twice_adds_only_the_missing_servers(cast):
    ensure_web_servers(2)
    assert bulk_add_web_servers(4) == 2
    before = web_servers()

    assert bulk_add_web_servers(4) == 0
    assert web_servers() == before
    assert bulk_add_web_servers(6) == 2
    assert sorted(web_servers()) == [f"web-{index:05d}" for index in range(6)]


def test_the_command_loads_the_scenario_in_bulk_then_only_adds_what_is_missing(capsys, tmp_path):
    keys = ["--keys-file", str(tmp_path / "keys.json")]  # never the demo's var/demo
    call_command("load_scenario", "--servers", "3", "--bulk", *keys)
    call_command("load_scenario", "--servers", "5", "--bulk", *keys)

    printed = capsys.readouterr().out
    assert "Added 3 web servers in bulk (0 existed already)" in printed
    assert "Added 2 web servers in bulk (3 existed already)" in printed
    assert Client.objects.filter(name__startswith="web-").count() == 5
    assert Client.objects.filter(name__endswith="-controller").count() == 2
    assert "Offered ready-made sends on the Send page: worm-alert" in printed
