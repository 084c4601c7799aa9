"""The Policy editor: live check with line and column, diff, effect, save by selector."""

import pytest
from django.urls import reverse

from broker.audit import Actor
from broker.models import AuditEntry, PolicyVersion
from broker.services.events import publish_event
from demo.scenario import WEB_SERVER_POLICY
from tests.module_data import copy_for_the_test, scenario_for_the_module

pytestmark = pytest.mark.django_db(databases=["default", "audit"])

MACROCORP_IIS = 'organization == "Macrocorp" and software == "IIS"'
ONLY_ALERTS = """accept event.alert exists and event.threat_level >= 4
    and sender.region == "Northwest" and sender.trust >= 2"""


loaded_scenario = scenario_for_the_module(servers=12)


@pytest.fixture
def scenario(loaded_scenario):
    return copy_for_the_test(loaded_scenario)


def test_the_editor_starts_from_the_current_policy_of_the_chosen_receivers(as_author, scenario):
    body = as_author.get(reverse("policy-editor"), {"selector": MACROCORP_IIS}).content.decode()
    assert 'data-target-count="4"' in body
    assert "sender.organization == &quot;Intellimune&quot;" in body


def test_a_wrong_type_is_reported_with_its_line_and_column(as_author, scenario):
    text = 'accept sender.trust >= "two"'
    data = {"selector": MACROCORP_IIS, "policy": text}
    body = as_author.post(reverse("policy-check"), data).content.decode()
    assert 'data-line="1" data-column="24"' in body
    assert 'class="error-at"' in body


def test_a_valid_policy_shows_the_diff_against_the_current_one(as_author, scenario):
    data = {"selector": MACROCORP_IIS, "policy": ONLY_ALERTS}
    body = as_author.post(reverse("policy-check"), data).content.decode()
    assert "data-policy-valid" in body
    assert '<span class="del">-    (sender.organization == &quot;Intellimune&quot;' in body


def test_the_preview_names_the_events_and_senders_newly_refused(as_author, scenario):
    intellimune = scenario.controllers["intellimune-national"]
    publish_event(
        sender=intellimune, actor=Actor("client", intellimune.name),
        content={"kind": "command", "action": "disable-cgi"}, selector='software == "IIS"',
    )  # fmt: skip
    data = {"selector": MACROCORP_IIS, "policy": ONLY_ALERTS}
    body = as_author.post(reverse("policy-preview"), data).content.decode()
    refused = body.split('data-newly="refused"')[1]
    assert "Newly refused: 1 event" in refused
    assert "intellimune-national</span>4 deliveries" in refused


def test_saving_by_selector_versions_every_chosen_receiver_and_audits_once(as_author, scenario):
    data = {"selector": MACROCORP_IIS, "policy": ONLY_ALERTS}
    body = as_author.post(reverse("policy-save"), data).content.decode()
    assert 'data-saved="4"' in body
    newest = PolicyVersion.objects.filter(version=2)
    assert newest.count() == 4 and all(v.created_by == "user:paula" for v in newest)
    entry = AuditEntry.objects.get(action="policy.set", actor="user:paula")
    assert entry.details["selection"] == MACROCORP_IIS


def test_an_invalid_policy_is_not_saved_anywhere(as_author, scenario):
    data = {"selector": MACROCORP_IIS, "policy": "accept sender.trust >= "}
    response = as_author.post(reverse("policy-save"), data)
    assert response.status_code == 400 and "data-save-refused" in response.content.decode()
    assert PolicyVersion.objects.filter(version=2).count() == 0


def test_an_operator_cannot_save_a_policy_and_the_refusal_is_audited(as_operator, scenario):
    data = {"selector": MACROCORP_IIS, "policy": WEB_SERVER_POLICY}
    response = as_operator.post(reverse("policy-save"), data)
    assert response.status_code == 403 and "policy author" in response.content.decode()
    assert AuditEntry.objects.using("audit").filter(action="policy.set").exists()


def test_choosing_no_receiver_says_how_to_choose(as_author, scenario):
    body = as_author.get(reverse("policy-editor")).content.decode()
    assert "Choose the receivers" in body
