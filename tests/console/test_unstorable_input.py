"""Text PostgreSQL cannot store (NUL) is refused with a 400 that says where, never a 500."""

import pytest

from broker.errors import InvalidInput
from broker.services.trust import plan_attestation
from demo.scenario import load_scenario

pytestmark = pytest.mark.django_db(databases=["default", "audit"])


@pytest.fixture
def scenario():
    return load_scenario(servers=2)


def test_a_nul_in_a_page_address_is_refused(as_auditor, scenario):
    response = as_auditor.get("/clients/%00/")
    assert response.status_code == 400
    assert "the address may not contain" in response.content.decode()


def test_a_nul_in_a_form_field_is_refused_naming_the_field(as_officer, scenario):
    data = {"authority": "trust-manager", "selector": "cgi", "values": "\x00 = 1"}
    response = as_officer.post("/trust/preview", data)
    assert response.status_code == 400
    assert response.content.decode().startswith("values may not contain")


def test_the_trust_services_refuse_a_nul_in_an_attribute_name(scenario):
    with pytest.raises(InvalidInput, match="may not contain"):
        plan_attestation(
            authority=scenario.trust_manager, clients=list(scenario.controllers.values()),
            values={"tr\x00ust": 2}, expires_at=None,
        )  # fmt: skip
