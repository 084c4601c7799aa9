"""The Trust page: authorities, keys shown once, attest / renew / revoke previewed."""

import pytest
from django.urls import reverse

from broker.models import AttributeValue, AuditEntry
from broker.services.authorities import authenticate_authority
from demo.scenario import load_scenario

pytestmark = pytest.mark.django_db(databases=["default", "audit"])

TRUST_OF_NORTHWEST = {
    "authority": "trust-manager",
    "operation": "attest",
    "client": "northwest-controller",
    "values": "trust = 3",
}


@pytest.fixture
def scenario():
    return load_scenario(servers=4)


def trust_value(name: str) -> AttributeValue:
    return AttributeValue.objects.get(client__name=name, name="trust")


def test_the_page_lists_authorities_with_capabilities_and_grants(as_auditor, scenario):
    body = as_auditor.get(reverse("trust")).content.decode()
    assert 'data-authority="trust-manager"' in body
    assert "Regulated trust manager" in body and "controller</span>trust" in body


def test_a_preview_changes_nothing_and_shows_before_and_after(as_officer, scenario):
    response = as_officer.post(reverse("trust-preview"), TRUST_OF_NORTHWEST)
    body = response.content.decode()
    assert 'data-accepted="1"' in body and "<code>2</code>" in body and "<code>3</code>" in body
    assert trust_value("northwest-controller").value == 2


def test_an_officer_attests_a_controllers_trust_and_it_is_audited(as_officer, scenario):
    response = as_officer.post(reverse("trust-apply"), TRUST_OF_NORTHWEST)
    assert "data-applied" in response.content.decode()
    value = trust_value("northwest-controller")
    assert value.value == 3 and value.source == "authority"
    entry = AuditEntry.objects.filter(action__contains="attest", actor="user:trevor").get()
    assert entry.outcome == "done"


def test_a_value_of_the_wrong_type_is_refused_with_the_reason(as_officer, scenario):
    data = {**TRUST_OF_NORTHWEST, "values": 'trust = "high"'}
    body = as_officer.post(reverse("trust-apply"), data).content.decode()
    assert 'data-accepted="0"' in body and "data-refusal" in body
    assert trust_value("northwest-controller").value == 2


def test_revoking_by_selector_records_who_revoked(as_officer, scenario):
    data = {"authority": "trust-manager", "operation": "revoke", "names": "trust",
            "selector": 'region == "Northwest" and scope == "regional"'}  # fmt: skip
    body = as_officer.post(reverse("trust-apply"), data).content.decode()
    assert 'data-accepted="2"' in body  # the Northwest controller and the rogue one
    value = trust_value("northwest-controller")
    assert value.revoked_at is not None and value.revoked_by == "user:trevor"


def test_a_bad_selector_or_a_missing_choice_is_explained(as_officer, scenario):
    data = {**TRUST_OF_NORTHWEST, "client": "", "selector": "region =="}
    response = as_officer.post(reverse("trust-preview"), data)
    assert response.status_code == 400 and "line 1" in response.content.decode()
    response = as_officer.post(reverse("trust-preview"), {**data, "selector": ""})
    assert "choose the clients" in response.content.decode()


def test_rotating_a_key_shows_the_new_one_once_and_the_old_one_stops(as_officer, scenario):
    old_key = scenario.secrets["trust-manager"]
    url = reverse("authority-manage", args=["trust-manager"])
    body = as_officer.post(url, {"do": "rotate"}).content.decode()
    new_key = body.split("data-new-key>")[1].split("<")[0]
    assert authenticate_authority(new_key).name == "trust-manager"
    with pytest.raises(Exception, match="unknown or disabled"):
        authenticate_authority(old_key)


def test_an_auditor_may_preview_but_not_apply_and_is_audited(as_auditor, scenario):
    assert as_auditor.post(reverse("trust-preview"), TRUST_OF_NORTHWEST).status_code == 200
    response = as_auditor.post(reverse("trust-apply"), TRUST_OF_NORTHWEST)
    assert response.status_code == 403 and "trust officer" in response.content.decode()
    assert trust_value("northwest-controller").value == 2
    refusal = AuditEntry.objects.using("audit").get(action="trust.apply")
    assert refusal.actor == "user:audrey" and refusal.outcome == "refused"
