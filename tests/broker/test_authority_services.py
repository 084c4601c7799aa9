"""Authorities attest attributes only with a grant and within their capabilities."""

from datetime import timedelta

import pytest
from django.utils import timezone

from broker.audit import Actor
from broker.errors import NotAuthorised
from broker.models import AuditEntry
from broker.reads.clients import attested_attributes, current_attributes
from broker.services.authorities import (
    attest_attributes,
    create_authority,
    grant_authority,
    revoke_grants,
)
from broker.services.clients import create_client_model, register_client
from demo.scenario import CONTROLLER_ATTRIBUTES, WEB_SERVER_ATTRIBUTES

pytestmark = pytest.mark.django_db(databases=["default", "audit"])
SETUP = Actor("user", "adam")


@pytest.fixture
def cast():
    web = create_client_model(name="web-server", attributes=WEB_SERVER_ATTRIBUTES, actor=SETUP)
    controller = create_client_model(
        name="controller", attributes=CONTROLLER_ATTRIBUTES, actor=SETUP
    )
    inventory, _ = create_authority(
        name="inventory",
        display_name="Macrocorp inventory",
        capabilities=web.attributes.filter(name__in=["region", "organization"]),
        actor=SETUP,
    )
    trust, _ = create_authority(
        name="trust-manager",
        display_name="Regulated trust manager",
        capabilities=controller.attributes.all(),
        actor=SETUP,
    )
    controller_client, _ = register_client(
        name="nw-controller", model=controller, can_send=True, can_receive=False, actor=SETUP
    )
    return inventory, trust, controller_client


def test_an_authority_with_a_grant_attests_and_the_values_say_who(cast):
    _, trust, controller = cast
    grant = grant_authority(client=controller, authority=trust, actor=Actor("client", "nw"))
    attest_attributes(authority=trust, client=controller, grant_key=grant, values={"trust": 2})
    value = controller.attribute_values.get(name="trust")
    assert (value.value, value.source, value.authority) == (2, "authority", trust)
    assert attested_attributes(controller) == {"trust": 2}


def test_attesting_without_a_grant_is_refused_and_audited(cast):
    _, trust, controller = cast
    with pytest.raises(NotAuthorised) as refused:
        attest_attributes(
            authority=trust, client=controller, grant_key="sng_forged", values={"trust": 3}
        )
    assert refused.value.field == "grant_key"
    assert not current_attributes(controller)
    assert (
        AuditEntry.objects.using("audit")
        .filter(action="attributes.attest", outcome="refused", actor="authority:trust-manager")
        .exists()
    )


def test_the_inventory_may_not_set_trust(cast):
    inventory, _, controller = cast
    grant = grant_authority(client=controller, authority=inventory, actor=Actor("client", "nw"))
    with pytest.raises(NotAuthorised) as refused:
        attest_attributes(
            authority=inventory, client=controller, grant_key=grant, values={"trust": 3}
        )
    assert "may not set trust" in refused.value.message


def test_an_expired_attestation_no_longer_qualifies_the_sender(cast):
    _, trust, controller = cast
    grant = grant_authority(client=controller, authority=trust, actor=Actor("client", "nw"))
    soon = timezone.now() + timedelta(seconds=30)
    attest_attributes(
        authority=trust, client=controller, grant_key=grant, values={"trust": 2}, expires_at=soon
    )
    assert attested_attributes(controller) == {"trust": 2}
    assert attested_attributes(controller, now=soon + timedelta(seconds=1)) == {}


def test_revoking_the_grant_revokes_the_authoritys_values(cast):
    _, trust, controller = cast
    grant = grant_authority(client=controller, authority=trust, actor=Actor("client", "nw"))
    attest_attributes(authority=trust, client=controller, grant_key=grant, values={"trust": 2})
    revoke_grants(client=controller, authority=trust, actor=Actor("client", "nw"))
    assert attested_attributes(controller) == {}
    with pytest.raises(NotAuthorised):
        attest_attributes(authority=trust, client=controller, grant_key=grant, values={"trust": 2})
