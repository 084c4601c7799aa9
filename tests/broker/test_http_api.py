"""The HTTP API through a real Uvicorn, with a real Celery worker running the tree."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
from django.conf import settings

from broker.models import AuditEntry, Client
from broker.protocol import AgentSelf
from broker.reads.clients import current_attributes
from broker.services.clients import issue_token
from broker.services.operators import issue_operator_token
from broker.services.presence import session_opened
from demo.scenario import load_scenario
from tests.broker.agent_helpers import ISSUER
from tests.broker.failing_database import inserts_refused
from tests.broker.tree_helpers import wait_until_idle
from tests.cast import ADMINISTRATOR, create_member

pytestmark = pytest.mark.django_db(transaction=True)

COMMAND = {"kind": "command", "action": "disable-cgi"}
IIS = 'receiver.software == "IIS"'


def call(base: str, method: str, path: str, token: str | None = None, body=None):
    """(status, JSON body) of one request."""
    data = json.dumps(body).encode() if body is not None else None
    return send_raw(base, method, path, token, data, "application/json")


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


def test_an_unsigned_publish_says_how_many_receivers_verify_signatures_and_will_refuse_it(
    asgi_server, world
):
    verifying = Client.objects.get(name="web-00000")  # web-00003, the other IIS, says nothing
    agent = AgentSelf("sn-agent 0.2.0", "signed")
    session_opened(client_id=verifying.pk, peer="192.0.2.1:5000", agent=agent)

    status, published = call(
        asgi_server, "POST", "/events", world["national"],
        {"content": COMMAND, "selector": IIS, "lifetime_s": 300, "channel": "soar"},
    )  # fmt: skip

    assert status == 201
    assert published["unsigned"]["reached"] == 2
    assert published["unsigned"]["verifying_receivers"] == 1
    assert "1 of the 2 receivers it reaches verify signatures" in published["unsigned"]["message"]


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
    assert refusal.details["category"] == "role_refused"


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


# Malformed input: an error naming the field, never a 500 -------------------------------


def send_raw(
    base: str, method: str, path: str, token: str | None, data: bytes | None, content_type: str
):
    """(status, JSON body) of a request whose body is sent as it is."""
    request = urllib.request.Request(base + "/api/v1" + path, data=data, method=method)
    request.add_header("Content-Type", content_type)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=20) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def post_json_text(base: str, path: str, token: str, text: str):
    return send_raw(base, "POST", path, token, text.encode(), "application/json")


@pytest.mark.parametrize(
    ("text", "field"),
    [
        (r'{"content": {"kind": "com\u0000mand"}}', "content.kind"),
        (r'{"content": {"kind": "x"}, "selector": "\u0000"}', "selector"),
        (r'{"content": {"kind": "\ud83d"}}', "content.kind"),
        ('{"content": {"kind": "x", "load": NaN}}', "content.load"),
        ('{"content": {"kind": "x"}, "lifetime_s": Infinity}', "lifetime_s"),
        ('{"content": {"kind": "x"}, "lifetime_s": 9223372036854775808}', "lifetime_s"),
    ],
)  # fmt: skip
def test_nul_lone_surrogates_nan_and_huge_numbers_in_a_body_are_400_naming_the_field(
    asgi_server, world, text, field
):
    status, error = post_json_text(asgi_server, "/events", world["national"], text)
    assert (status, error["code"], error["field"]) == (400, "invalid", field)


def test_a_body_nested_twenty_thousand_deep_is_400_naming_the_body(asgi_server, world):
    text = '{"content": {"kind": ' + "[" * 20_000 + "]" * 20_000 + "}}"
    status, error = post_json_text(asgi_server, "/events", world["national"], text)
    assert (status, error["code"], error["field"]) == (400, "invalid", "body")


def test_a_body_that_is_not_json_text_is_400_naming_the_body(asgi_server, world):
    status, error = post_json_text(asgi_server, "/events", world["national"], '{"content": ')
    assert (status, error["field"]) == (400, "body")
    status, error = send_raw(
        asgi_server, "POST", "/events", world["national"], b'{"a": "\xff"}', "application/json"
    )
    assert (status, error["field"]) == (400, "body")


def test_a_body_that_is_not_application_json_is_415_naming_the_content_type(asgi_server, world):
    body = json.dumps({"content": COMMAND}).encode()
    status, error = send_raw(asgi_server, "POST", "/events", world["national"], body, "text/plain")
    assert (status, error["field"]) == (415, "Content-Type")
    assert error["code"] == "unsupported_media_type"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"content": COMMAND, "channel": "abc\n"}, "channel"),
        ({"content": {"kind\n": "command"}}, "content.kind\n"),
        ({"content": {}}, "content"),
    ],
)
def test_names_must_match_whole_and_content_may_not_be_empty(asgi_server, world, body, field):
    status, error = call(asgi_server, "POST", "/events", world["national"], body)
    assert (status, error["code"], error["field"]) == (400, "invalid", field)
    assert AuditEntry.objects.filter(action="event.publish", outcome="refused").exists()


@pytest.mark.parametrize(
    "name", ["", "a/b", "web\n", "-web", "..", "x" * 129, "web\x00", "spaced name"]
)
def test_a_client_name_outside_the_rule_is_refused_when_registering(asgi_server, world, name):
    body = {"name": name, "model": "web-server"}
    status, error = call(asgi_server, "POST", "/clients", world["adam"], body)
    assert (status, error["code"], error["field"]) == (400, "invalid", "name")


@pytest.mark.parametrize("name", ["web%00", "web%0A", "-web"])
def test_a_client_name_in_the_path_outside_the_rule_is_400_naming_it(asgi_server, world, name):
    status, error = call(asgi_server, "POST", f"/clients/{name}/tokens", world["adam"])
    assert (status, error["code"], error["field"]) == (400, "invalid", "name")


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("offset=9223372036854775808", "offset"),
        ("offset=-1", "offset"),
        ("limit=0", "limit"),
        ("limit=1001", "limit"),
        ("model=web%00server", "model"),
    ],
)
def test_query_parameters_out_of_range_or_holding_nul_are_400_naming_them(
    asgi_server, world, query, field
):
    status, error = call(asgi_server, "GET", f"/clients?{query}", world["adam"])
    assert (status, error["code"], error["field"]) == (400, "invalid", field)


def test_an_attestation_expiry_without_a_time_zone_is_400_naming_it(asgi_server, world):
    body = {"grant_key": "sng_x", "values": {"region": "X"}, "expires_at": "2999-01-01T00:00:00"}
    key = world["scenario"].secrets["macrocorp-inventory"]
    status, error = call(asgi_server, "POST", "/clients/web-00001/attestations", key, body)
    assert (status, error["code"], error["field"]) == (400, "invalid", "expires_at")


def test_an_oversized_name_in_a_refusal_is_audited_cut_to_fit(asgi_server, world):
    # Olivia may not register clients; her refusal names the 300-character name.
    body = {"name": "w" * 300, "model": "web-server"}
    status, error = call(asgi_server, "POST", "/clients", world["olivia"], body)
    assert (status, error["code"]) == (403, "not_authorised")
    refusal = AuditEntry.objects.get(action="client.register", outcome="refused")
    assert len(refusal.target) == 200 and refusal.target.startswith("www")


def test_the_schema_declares_every_operations_errors_and_refuses_empty_content(asgi_server):
    with urllib.request.urlopen(asgi_server + "/api/v1/openapi.json", timeout=10) as response:
        schema = json.loads(response.read())
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            declared = set(operation["responses"])
            assert {"400", "401", "403", "404"} <= declared, (method, path)
            if "requestBody" in operation:
                assert {"413", "415"} <= declared, (method, path)
            error = operation["responses"]["400"]["content"]["application/json"]["schema"]
            assert error == {"$ref": "#/components/schemas/ErrorOut"}
    components = schema["components"]["schemas"]
    assert components["EventIn"]["properties"]["content"]["minProperties"] == 1
    assert components["PreviewIn"]["properties"]["content"]["minProperties"] == 1
    assert {"code", "message", "field"} <= set(components["ErrorOut"]["required"])


def test_a_body_beyond_the_upload_limit_is_413_naming_the_body(asgi_server, world):
    text = json.dumps({"content": {"kind": "x" * (settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 1)}})
    status, error = post_json_text(asgi_server, "/events", world["national"], text)
    assert (status, error["code"], error["field"]) == (413, "too_large", "body")


def test_a_server_failure_is_answered_as_json_internal_and_is_not_a_client_error(
    asgi_server, world
):
    # The last line of defence, reached through a real database failure.
    with inserts_refused("broker_clienttoken"):
        status, error = call(asgi_server, "POST", "/clients/web-00001/tokens", world["adam"])
    assert (status, error["code"], error["field"]) == (500, "internal", None)
