"""The HTTP API through a real Daphne, with a real Celery worker running the tree."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from broker.models import AuditEntry
from broker.scenario import load_scenario
from broker.selectors import current_attributes
from broker.services.clients import issue_token
from broker.services.operators import issue_operator_token
from tests.broker.agent_helpers import ISSUER
from tests.broker.tree_helpers import wait_until_idle
from tests.cast import ADMINISTRATOR, create_member

pytestmark = pytest.mark.django_db(transaction=True)

COMMAND = {"kind": "command", "action": "disable-cgi"}
IIS = 'receiver.software == "IIS"'


def call(base: str, method: str, path: str, token: str | None = None, body=None):
    """(status, JSON body) of one request."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(base + "/api/v1" + path, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=20) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


@pytest.fixture
def world(celery_worker, operator):
    scenario = load_scenario(servers=6)
    wait_until_idle()
    national = scenario.controllers["intellimune-national"]
    northwest = scenario.controllers["northwest-controller"]
    return {
        "scenario": scenario,
        "national": issue_token(client=national, actor=ISSUER),
        "northwest": issue_token(client=northwest, actor=ISSUER),
        "olivia": issue_operator_token(user=operator, label="soar", actor=ISSUER),
        "adam": issue_operator_token(user=create_member(ADMINISTRATOR), label="x", actor=ISSUER),
    }


def test_the_openapi_schema_is_served_and_names_every_endpoint(asgi_server):
    with urllib.request.urlopen(asgi_server + "/api/v1/openapi.json", timeout=10) as response:
        schema = json.loads(response.read())
    assert schema["openapi"].startswith("3.")
    assert {"/api/v1/events", "/api/v1/events/preview", "/api/v1/events/{event_id}",
            "/api/v1/clients", "/api/v1/clients/{name}/tokens",
            "/api/v1/clients/{name}/attestations"} <= set(schema["paths"])  # fmt: skip
    assert "ClientToken" in schema["components"]["securitySchemes"]


def test_a_client_publishes_and_reads_the_delivery_status_of_its_event(asgi_server, world):
    status, published = call(
        asgi_server, "POST", "/events", world["national"],
        {"content": COMMAND, "selector": IIS, "lifetime_s": 300, "channel": "soar"},
    )  # fmt: skip
    assert status == 201 and published["channel"] == "soar" and published["sequence"] == 1
    wait_until_idle()
    status, event = call(asgi_server, "GET", f"/events/{published['event']}", world["national"])
    assert status == 200 and event["sender"] == "intellimune-national"
    assert [d["receiver"] for d in event["deliveries"]] == ["web-00000", "web-00003"]
    # No agent is connected: recorded, not yet confirmed by an agent.
    assert event["counts"] == {"pending": 2, "delivered": 0, "acked": 0, "failed": 0, "expired": 0}


def test_preview_names_exactly_the_receivers_selector_and_policies_agree_on(asgi_server, world):
    status, preview = call(
        asgi_server, "POST", "/events/preview", world["national"],
        {"content": COMMAND, "selector": IIS},
    )  # fmt: skip
    assert status == 200 and preview == {"count": 2, "receivers": ["web-00000", "web-00003"]}
    # The web servers' policy refuses commands from a regional controller.
    status, refused = call(
        asgi_server, "POST", "/events/preview", world["northwest"],
        {"content": COMMAND, "selector": IIS},
    )  # fmt: skip
    assert status == 200 and refused == {"count": 0, "receivers": []}


@pytest.mark.parametrize(
    ("body", "status", "code", "field"),
    [
        ({}, 400, "invalid", "content"),
        ({"content": COMMAND, "lifetime_s": "soon"}, 400, "invalid", "lifetime_s"),
        ({"content": {"sender.trust": 3}}, 403, "not_authorised", "content.sender.trust"),
        ({"content": COMMAND, "selector": "receiver.load >"}, 400, "policy_rejected",
         "selector"),
        ({"content": COMMAND, "lifetime_s": 0}, 400, "invalid", "lifetime_s"),
    ],
)  # fmt: skip
def test_bad_events_are_refused_with_the_offending_field(asgi_server, world, body, status, code,
                                                          field):  # fmt: skip
    got_status, error = call(asgi_server, "POST", "/events", world["national"], body)
    assert (got_status, error["code"], error["field"]) == (status, code, field)


@pytest.mark.parametrize(
    ("selector", "position", "reason"),
    [
        ('load >= "high"', (1, 9), "expected a number for 'load' (float)"),
        ('cgi == "yes"', (1, 8), "expected true or false for 'cgi' (bool)"),
        ("lod > 1", (1, 1), "did you mean 'load'?"),
    ],
)
def test_an_ill_typed_selector_is_refused_with_position_and_expected_type(
    asgi_server, world, selector, position, reason
):
    for path in ("/events", "/events/preview"):
        status, error = call(
            asgi_server, "POST", path, world["national"], {"content": COMMAND, "selector": selector}
        )
        assert (status, error["code"], error["field"]) == (400, "policy_rejected", "selector")
        assert (error["line"], error["column"]) == position and reason in error["message"]


def test_a_content_value_not_fitting_its_declared_type_is_refused(asgi_server, world):
    body = {"content": {"kind": "alert", "alert": "worm", "threat_level": "4"}}
    status, error = call(asgi_server, "POST", "/events", world["northwest"], body)
    assert (status, error["code"], error["field"]) == (400, "invalid", "content.threat_level")
    assert "must be a whole number" in error["message"]


def test_a_version_range_is_previewed_as_versions_compare(asgi_server, world):
    status, preview = call(
        asgi_server, "POST", "/events/preview", world["national"],
        {"content": COMMAND, "selector": 'receiver.software == "IIS" and version < "2.10"'},
    )  # fmt: skip
    versions = {
        s.name: current_attributes(s)["version"]
        for s in world["scenario"].servers
        if current_attributes(s)["software"] == "IIS"
    }
    # As text, "2.4.1" < "2.10" is false: only a typed preview finds these.
    expected = sorted(name for name, v in versions.items() if _numeric(v) < (2, 10))
    assert status == 200 and expected and preview["receivers"] == expected


def _numeric(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def test_calls_without_a_fitting_token_are_unauthenticated(asgi_server, world):
    assert call(asgi_server, "POST", "/events", None, {"content": COMMAND})[0] == 401
    status, error = call(asgi_server, "POST", "/events", "snt_forged", {"content": COMMAND})
    assert status == 401 and error["code"] == "authentication_failed"
    # A client token does not open the operators' endpoints.
    assert call(asgi_server, "GET", "/clients", world["national"])[0] == 401


def test_a_client_cannot_read_another_clients_event(asgi_server, world):
    _, published = call(asgi_server, "POST", "/events", world["national"], {"content": COMMAND})
    status, error = call(asgi_server, "GET", f"/events/{published['event']}", world["northwest"])
    assert status == 404 and error["field"] == "event_id"


def test_an_operator_without_the_permission_is_refused_and_audited(asgi_server, world):
    status, error = call(
        asgi_server, "POST", "/clients", world["olivia"],
        {"name": "web-new", "model": "web-server"},
    )  # fmt: skip
    assert status == 403 and error["code"] == "not_authorised"
    refusal = AuditEntry.objects.get(action="client.register", outcome="refused")
    assert refusal.actor == "user:olivia"


def test_an_administrator_registers_provisions_and_revokes_a_client(asgi_server, world):
    adam = world["adam"]
    body = {"name": "web-new", "model": "web-server", "can_receive": True}
    status, registered = call(asgi_server, "POST", "/clients", adam, body)
    assert status == 201 and registered["secret"].startswith("sns_")
    status, issued = call(asgi_server, "POST", "/clients/web-new/tokens", adam)
    assert status == 201 and issued["token"].startswith("snt_")
    assert call(asgi_server, "DELETE", "/clients/web-new/tokens", adam) == (200, {"revoked": 1})
    status, listed = call(asgi_server, "GET", "/clients?model=web-server&limit=3", adam)
    assert status == 200 and [c["name"] for c in listed] == ["web-00000", "web-00001", "web-00002"]
    assert listed[0]["attributes"]["region"] == "Northwest"
    assert AuditEntry.objects.filter(action="client.register", actor="user:adam").exists()


def test_an_authority_attests_where_granted_and_within_its_capabilities(asgi_server, world):
    scenario = world["scenario"]
    key = scenario.secrets["macrocorp-inventory"]
    grant = scenario.grants[("web-00001", "macrocorp-inventory")]
    body = {"grant_key": grant, "values": {"region": "Southwest"}}
    status, answer = call(asgi_server, "POST", "/clients/web-00001/attestations", key, body)
    assert (status, answer) == (200, {"attested": ["region"]})
    server = next(s for s in scenario.servers if s.name == "web-00001")
    assert current_attributes(server)["region"] == "Southwest"
    wrong_grant = {"grant_key": "sng_nope", "values": {"region": "Northwest"}}
    status, error = call(asgi_server, "POST", "/clients/web-00001/attestations", key, wrong_grant)
    assert (status, error["field"]) == (403, "grant_key")
    beyond = {"grant_key": grant, "values": {"load": 0.1}}
    status, error = call(asgi_server, "POST", "/clients/web-00001/attestations", key, beyond)
    assert (status, error["field"]) == (403, "load")
    revoke = {"names": ["region"]}
    status, answer = call(
        asgi_server, "POST", "/clients/web-00001/attestations/revoke", key, revoke
    )
    assert (status, answer) == (200, {"revoked": 1})
    assert "region" not in current_attributes(server)
