"""The pages' query counts do not grow with the fleet (no N+1): pinned at two sizes."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from broker.audit import Actor
from broker.services.events import publish_event
from demo.scenario import bulk_add_web_servers, load_scenario

pytestmark = pytest.mark.django_db(databases=["default", "audit"], transaction=True)

PAGES = {
    "fleet": ("get", "/fleet/", {"q": 'software == "IIS"'}),
    "client": ("get", "/clients/web-00001/", {}),
    "tree": ("get", "/tree/", {}),
    "preview": ("post", "/policies/preview",
                {"selector": 'organization == "Macrocorp"', "policy": "accept event.kind exists"}),
}  # fmt: skip
# What each page costs, whatever the size of the fleet (session, user, the device that
# proved their second factor, and permissions included); a change that adds a query per
# row fails here.
PINNED = {"fleet": 14, "client": 18, "preview": 24, "tree": 11}


def queries(client, page: str) -> int:
    method, path, data = PAGES[page]
    getattr(client, method)(path, data)  # builds this process's directory first
    with CaptureQueriesContext(connection) as captured:
        assert getattr(client, method)(path, data).status_code == 200
    return len(captured)


@pytest.mark.parametrize("page", sorted(PAGES))
def test_a_page_costs_the_same_queries_for_12_and_300_servers(as_auditor, page):
    scenario = load_scenario(servers=12)
    for index in range(3):
        sender = scenario.controllers["intellimune-national"]
        content = {"kind": "command", "action": f"status-{index}"}
        publish_event(sender=sender, actor=Actor("client", sender.name), content=content)
    small = queries(as_auditor, page)
    bulk_add_web_servers(300)
    large = queries(as_auditor, page)
    assert (small, large) == (PINNED[page], PINNED[page])
