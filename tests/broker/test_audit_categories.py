"""Every refusal says what kind it is (details["category"]), decided by the services
that refuse, through the real services."""

from __future__ import annotations

import pytest

from broker import audit
from broker.audit import Actor, record_refusal
from broker.errors import BrokerError, InvalidInput
from broker.models import AuditEntry
from broker.services.authorities import attest_attributes
from broker.services.clients import log_in_client, state_attributes
from broker.services.events import publish_event
from broker.services.sending import Draft, send_as
from broker.services.trust import attest_for_clients
from demo.scenario import load_scenario
from tests.cast import OPERATOR, create_member

pytestmark = pytest.mark.django_db(databases=["default", "audit"])


@pytest.fixture
def scenario():
    return load_scenario(servers=2)


def refused_category(action: str) -> str:
    entry = AuditEntry.objects.using("audit").get(action=action, outcome="refused")
    return entry.details["category"]


def test_a_server_stating_an_attested_attribute_is_attribute_not_authorised(scenario):
    server = scenario.servers[0]
    with pytest.raises(BrokerError):
        state_attributes(client=server, values={"region": "Northwest"}, actor=Actor("client", "x"))
    assert refused_category("attributes.state") == audit.ATTRIBUTE_NOT_AUTHORISED


def test_a_value_of_the_wrong_type_is_other(scenario):
    server = scenario.servers[0]
    with pytest.raises(InvalidInput):
        state_attributes(client=server, values={"load": "high"}, actor=Actor("client", "x"))
    assert refused_category("attributes.state") == audit.OTHER


def test_an_authority_attesting_beyond_its_capabilities_is_attribute_not_authorised(scenario):
    server = scenario.servers[0]
    grant = scenario.grants[(server.name, scenario.inventory.name)]
    with pytest.raises(BrokerError):
        attest_attributes(
            authority=scenario.inventory, client=server, grant_key=grant, values={"load": 0.1}
        )
    assert refused_category("attributes.attest") == audit.ATTRIBUTE_NOT_AUTHORISED


def test_a_trust_plans_refused_clients_are_attribute_not_authorised(scenario):
    # The inventory may not set `load` (the servers state it): every client is refused.
    attest_for_clients(
        authority=scenario.inventory,
        clients=scenario.servers,
        values={"load": 0.5},
        expires_at=None,
        actor=Actor("user", "trevor"),
    )
    assert refused_category("attributes.attest") == audit.ATTRIBUTE_NOT_AUTHORISED


def test_a_sender_forging_its_attributes_in_the_content_is_attribute_not_authorised(scenario):
    northwest = scenario.controllers["northwest-controller"]
    with pytest.raises(BrokerError):
        publish_event(sender=northwest, content={"kind": "alert", "sender.trust": 3})
    assert refused_category("event.publish") == audit.ATTRIBUTE_NOT_AUTHORISED


def test_an_operator_sending_as_a_sender_they_may_not_is_role_refused(scenario):
    olivia = create_member(OPERATOR)
    draft = Draft(sender=scenario.controllers["rogue-controller"], content={"kind": "alert"})
    with pytest.raises(BrokerError):
        send_as(user=olivia, draft=draft, confirmed_count=None, code_is_fresh=True)
    assert refused_category("event.send") == audit.ROLE_REFUSED


def test_a_failed_login_is_other(scenario):
    with pytest.raises(BrokerError):
        log_in_client(name=scenario.servers[0].name, secret="wrong")
    assert refused_category("client.login") == audit.OTHER


def test_a_category_the_caller_states_wins():
    entry = record_refusal(
        actor=Actor("user", "olivia"),
        action="attributes.attest",
        target="client:web-00000",
        reason="lacks the permission",
        details={"category": audit.ROLE_REFUSED},
    )
    assert entry.details["category"] == audit.ROLE_REFUSED
