"""The Client page: provenance, policy history with diffs, tokens, deliveries."""

import pytest
from django.urls import reverse

from broker.audit import Actor
from broker.models import ClientToken
from broker.protocol import AgentSelf
from broker.services.policies import set_policy
from broker.services.presence import session_opened
from demo.scenario import load_scenario

pytestmark = pytest.mark.django_db(databases=["default", "audit"])


@pytest.fixture
def scenario():
    return load_scenario(servers=4)


def test_attributes_show_who_stated_or_attested_them(as_auditor, scenario):
    body = as_auditor.get(reverse("client", args=["web-00001"])).content.decode()
    region = body.split('data-attribute="region"')[1].split("</tr>")[0]
    assert "attested" in region and "Macrocorp inventory" in region
    software = body.split('data-attribute="software"')[1].split("</tr>")[0]
    assert "self-stated" in software


def test_policy_history_shows_the_diff_of_a_version(as_auditor, scenario):
    server = scenario.servers[0]
    set_policy(client=server, text='accept event.kind == "command"', actor=Actor("user", "x"))
    body = as_auditor.get(reverse("client", args=[server.name]), {"diff": "2"}).content.decode()
    assert "Changes in version 2 against 1" in body
    assert '<span class="add">+accept event.kind == &quot;command&quot;</span>' in body


def test_an_operator_issues_a_token_shown_once_and_revokes_them(as_operator, scenario):
    url = reverse("client-tokens", args=["web-00002"])
    body = as_operator.post(url, {"do": "issue"}).content.decode()
    assert "data-new-token>snt_" in body
    as_operator.post(url, {"do": "revoke"})
    assert ClientToken.objects.filter(client__name="web-00002", revoked_at=None).count() == 0


def test_an_unknown_client_is_a_404(as_auditor, scenario):
    assert as_auditor.get(reverse("client", args=["nobody"])).status_code == 404


def test_an_auditor_cannot_issue_tokens(as_auditor, scenario):
    response = as_auditor.post(reverse("client-tokens", args=["web-00002"]), {"do": "issue"})
    assert response.status_code == 403
    assert not ClientToken.objects.filter(client__name="web-00002").exists()


def test_the_page_says_whether_the_agent_verifies_signatures_and_flags_one_that_does_not(
    as_auditor, scenario
):
    insecure, silent = scenario.servers[0], scenario.servers[1]
    agent = AgentSelf("sn-agent 0.2.0", "anything")
    session_opened(client_id=insecure.pk, peer="192.0.2.1:5000", agent=agent)

    flagged = as_auditor.get(reverse("client", args=[insecure.name])).content.decode()
    unknown = as_auditor.get(reverse("client", args=[silent.name])).content.decode()

    assert 'data-verifies="no: acts on anything"' in flagged
    assert "insecure_accept_unsigned" in flagged and "sn-agent 0.2.0" in flagged
    assert 'data-verifies="unknown"' in unknown
