"""Typed addressing through the real tree (real Celery worker, PostgreSQL, Redis): a
selector's version literal compares as a version from publishing to delivery."""

import pytest

from broker.audit import Actor
from broker.models import Delivery
from broker.services.clients import state_attributes
from broker.services.events import publish_event
from demo.scenario import load_scenario
from tests.broker.tree_helpers import wait_until_idle

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "audit"])

# Versions that text comparison orders wrongly: "2.10.1" < "2.4" < "2.9" as text.
VERSIONS = {"web-00000": "2.10.1", "web-00001": "2.9", "web-00002": "2.4", "web-00003": "1.9"}


@pytest.fixture
def servers(celery_worker):
    """Four web servers of the scenario, running the versions above."""
    scenario = load_scenario(servers=4)
    for server in scenario.servers:
        version = {"version": VERSIONS[server.name]}
        state_attributes(client=server, values=version, actor=Actor("client", server.name))
    wait_until_idle()
    return scenario


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ('version >= "2.4"', {"web-00000", "web-00001", "web-00002"}),
        ('version < "2.10"', {"web-00001", "web-00002", "web-00003"}),
        ('version == "2.4.0"', {"web-00002"}),
        ('version > "2.9" or version ~ "1.*"', {"web-00000", "web-00003"}),
    ],
    ids=["at least 2.4", "below 2.10", "2.4.0 is 2.4", "typed and glob together"],
)
def test_a_version_range_reaches_exactly_the_receivers_in_range(servers, selector, expected):
    command = publish_event(
        sender=servers.controllers["intellimune-national"],
        content={"kind": "command", "action": "status"},
        selector=selector,
    )
    wait_until_idle()
    delivered = Delivery.objects.filter(event=command).values_list("receiver__name", flat=True)
    assert set(delivered) == expected
