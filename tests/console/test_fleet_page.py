"""The Fleet page: search by selector (validated), facets, paging, bulk actions."""

import re

import pytest
from django.urls import reverse

from broker.audit import SYSTEM
from broker.models import AuditEntry, Client, ClientToken
from broker.protocol import AgentSelf
from broker.reads.directory import forget_directory
from broker.services.clients import issue_token
from broker.services.presence import session_opened
from tests.module_data import copy_for_the_test, scenario_for_the_module

pytestmark = pytest.mark.django_db(databases=["default", "audit"])


loaded_fleet = scenario_for_the_module(servers=60)


@pytest.fixture
def fleet(loaded_fleet):
    return copy_for_the_test(loaded_fleet)


def test_the_fleet_lists_every_client_a_page_at_a_time(as_auditor, fleet):
    body = as_auditor.get(reverse("fleet")).content.decode()
    assert 'data-total="63"' in body  # 60 servers and 3 controllers
    assert "Page 1 of 2" in body
    assert body.count("<tr data-client=") == 50
    last = as_auditor.get(reverse("fleet"), {"page": 2}).content.decode()
    assert last.count("<tr data-client=") == 13


def test_a_selector_narrows_the_fleet_and_facets_count_what_matched(as_auditor, fleet):
    response = as_auditor.get(
        reverse("fleet"), {"q": 'software == "IIS" and region == "Northwest"'}
    )
    body = response.content.decode()
    expected = Client.objects.filter(
        attribute_values__name="software", attribute_values__value="IIS"
    ).filter(attribute_values__name="region", attribute_values__value="Northwest")
    assert f'data-total="{expected.count()}"' in body
    assert expected.count() > 0
    assert 'data-facet="software"' in body and "IIS" in body


def test_a_wrong_selector_says_what_and_where_without_failing(as_auditor, fleet):
    response = as_auditor.get(reverse("fleet"), {"q": 'sofware == "IIS"'}, HTTP_HX_REQUEST="true")
    body = response.content.decode()
    assert response.status_code == 400
    assert 'data-error-line="1"' in body and 'data-error-column="1"' in body
    assert "software" in body  # the suggestion


def test_a_literal_of_the_wrong_type_is_refused_with_its_column(as_auditor, fleet):
    response = as_auditor.get(reverse("fleet"), {"q": 'load >= "high"'}, HTTP_HX_REQUEST="true")
    assert response.status_code == 400
    assert 'data-error-column="9"' in response.content.decode()


def test_htmx_gets_only_the_results_partial(as_auditor, fleet):
    body = as_auditor.get(reverse("fleet"), {"q": "cgi"}, HTTP_HX_REQUEST="true").content.decode()
    assert "<html" not in body and "data-total=" in body


def test_sorting_by_name_descending_puts_the_last_name_first(as_auditor, fleet):
    body = as_auditor.get(reverse("fleet"), {"sort": "-name"}).content.decode()
    assert body.index('data-client="web-00059"') < body.index('data-client="web-00058"')


def test_an_operator_revokes_the_tokens_of_all_matching_clients_after_confirming(
    as_operator, fleet
):
    for server in fleet.servers:
        issue_token(client=server, actor=SYSTEM)
    # The model narrows it to servers: two controllers are in the Northwest too.
    data = {"action": "revoke_tokens", "scope": "all", "q": 'region == "Northwest"'}
    data["model"] = "web-server"
    first = as_operator.post(reverse("fleet-bulk"), data)
    assert "Yes, revoke the tokens of 15" in first.content.decode()
    assert ClientToken.objects.filter(revoked_at__isnull=False).count() == 0
    as_operator.post(reverse("fleet-bulk"), {**data, "confirm": "yes"})
    assert ClientToken.objects.filter(revoked_at__isnull=False).count() == 15
    entry = AuditEntry.objects.filter(action="client.revoke_tokens").get()
    assert entry.actor == "user:olivia" and len(entry.details["clients"]["names"]) == 15


def test_deactivated_clients_show_as_inactive(as_operator, fleet):
    ids = [str(c.pk) for c in fleet.servers[:2]]
    as_operator.post(
        reverse("fleet-bulk"), {"action": "deactivate", "client": ids, "confirm": "yes"}
    )
    assert Client.objects.filter(is_active=False).count() == 2
    body = as_operator.get(reverse("fleet"), {"q": 'hostname == "web-00000"'}).content.decode()
    assert "inactive" in body


def test_an_auditor_cannot_take_bulk_actions_and_the_refusal_is_audited(as_auditor, fleet):
    data = {"action": "deactivate", "scope": "all", "q": "", "confirm": "yes"}
    response = as_auditor.post(reverse("fleet-bulk"), data)
    assert response.status_code == 403
    assert "operator" in response.content.decode()
    assert Client.objects.filter(is_active=False).count() == 0
    refusal = AuditEntry.objects.using("audit").get(action="fleet.bulk_action")
    assert refusal.outcome == "refused" and refusal.actor == "user:audrey"


def test_unknown_presence_filters_are_ignored_rather_than_matching_nothing(as_auditor, fleet):
    body = as_auditor.get(reverse("fleet"), {"connected": "maybe", "seen": "soon"}).content
    assert b'data-total="63"' in body


def test_the_fleet_says_which_agents_verify_signatures_and_filters_by_it(as_auditor, fleet):
    said = {"web-00000": "signed", "web-00001": "anything", "web-00002": "nothing"}
    for server in Client.objects.filter(name__in=said):
        agent = AgentSelf("sn-agent 0.2.0", said[server.name])
        session_opened(client_id=server.pk, peer="192.0.2.1:5000", agent=agent)
    forget_directory()  # this process's directory was built before the logins

    body = as_auditor.get(reverse("fleet")).content.decode()
    filtered = as_auditor.get(reverse("fleet"), {"verifies": "no: acts on anything"})

    assert facet_counts(body, "verifies signatures") == {
        "yes": 1, "no: acts on anything": 1, "no: runs no action": 1, "unknown": 60,
    }  # fmt: skip
    assert b'data-total="1"' in filtered.content and b"web-00001" in filtered.content
    assert b'name="verifies" value="no: acts on anything"' in filtered.content  # bulk: the same


def facet_counts(body: str, facet: str) -> dict[str, int]:
    pattern = rf'data-facet="{facet}">([^<]*)</a>\s*<span class="count">([\d,]+)</span>'
    return {label: int(count.replace(",", "")) for label, count in re.findall(pattern, body)}
