"""The Why / why not page: three checks clause by clause with the values tested and
their provenance, the route through the tree, reached from the client page."""

import uuid

import pytest
from django.urls import reverse

from broker.models import AuditEntry, Event
from broker.services.events import publish_event
from demo.scenario import load_scenario
from tests.broker.tree_helpers import wait_until_idle
from tests.cast import Member, create_member

pytestmark = pytest.mark.django_db(databases=["default", "audit"])

WORM_ALERT = {"kind": "alert", "alert": "worm", "threat_level": 4, "target": "IIS"}
NORTHWEST = 'region == "Northwest"'
NO_ROLE = Member("nora", "nora-has-no-role-yet-42")


@pytest.fixture
def scenario():
    # Nothing here commits, so nothing is routed: the events stay undelivered.
    return load_scenario(servers=4)


def publish(scenario, sender: str, content: dict, selector: str = "") -> Event:
    return publish_event(sender=scenario.controllers[sender], content=content, selector=selector)


def why_url(event: Event, name: str) -> str:
    return reverse("event-why", args=[event.pk, name])


def section(body: str, check: str) -> str:
    return body.split(f'data-check="{check}"')[1].split("</section>")[0]


def test_a_refused_sender_is_explained_clause_by_clause_with_provenance(as_auditor, scenario):
    alert = publish(scenario, "rogue-controller", WORM_ALERT, NORTHWEST)
    response = as_auditor.get(why_url(alert, "web-00000"))
    body = response.content.decode()
    assert response.status_code == 200
    assert (
        "web-00000 did not get it: its policy refused the sender: "
        "sender.trust &gt;= 2 (sender.trust is 1)"
    ) in body
    selector = section(body, "selector")
    region = selector.split('data-clause="region"')[1].split("</tr>")[0]
    assert 'data-holds="yes"' in region and "&quot;Northwest&quot;" in region
    assert "macrocorp-inventory" in region
    policy = section(body, "policy")
    trust = policy.split('data-clause="sender.trust"')[1].split("</tr>")[0]
    assert 'data-part="sender" data-holds="no"' in trust and "trust-manager" in trust
    level = policy.split('data-clause="event.threat_level"')[1].split("</tr>")[0]
    assert 'data-part="content" data-holds="yes"' in level and "the event's content" in level
    assert 'data-sender-attribute="trust"' in policy
    assert "no hop of this event" in section(body, "route").lower()


def test_a_sender_and_an_event_without_selector_are_explained(as_auditor, scenario):
    command = publish(scenario, "intellimune-national", {"kind": "command", "action": "status"})
    body = as_auditor.get(why_url(command, "northwest-controller")).content.decode()
    assert "it is not a receiver (it only sends)" in body
    assert "data-no-selector" in section(body, "selector")
    assert "data-not-receiver" in section(body, "policy")


def test_an_unknown_event_or_client_is_a_404_that_says_which(as_auditor, scenario):
    alert = publish(scenario, "northwest-controller", WORM_ALERT, NORTHWEST)
    missing = uuid.uuid4()
    response = as_auditor.get(reverse("event-why", args=[missing, "web-00000"]))
    assert response.status_code == 404
    assert f"There is no event {missing}." in response.content.decode()
    response = as_auditor.get(why_url(alert, "nobody"))
    assert response.status_code == 404
    assert "There is no client named &#x27;nobody&#x27;." in response.content.decode()


def test_the_page_needs_the_read_permission_and_a_refusal_is_audited(client, scenario):
    alert = publish(scenario, "northwest-controller", WORM_ALERT, NORTHWEST)
    assert client.get(why_url(alert, "web-00000")).status_code == 302  # to the login
    client.force_login(create_member(NO_ROLE))
    assert client.get(why_url(alert, "web-00000")).status_code == 403
    refusal = AuditEntry.objects.using("audit").get(action="event.why", outcome="refused")
    assert refusal.actor == f"user:{NO_ROLE.username}"


def test_the_client_page_lists_the_newest_events_each_with_its_why(as_auditor, scenario):
    alert = publish(scenario, "northwest-controller", WORM_ALERT, NORTHWEST)
    body = as_auditor.get(reverse("client", args=["web-00001"])).content.decode()
    row = body.split(f'data-event="{alert.pk}"')[1].split("</tr>")[0]
    assert f'href="{why_url(alert, "web-00001")}"' in row and "why not" in row


def test_the_why_form_goes_to_the_page_of_the_event_given(as_auditor, scenario):
    alert = publish(scenario, "northwest-controller", WORM_ALERT, NORTHWEST)
    url = reverse("client-why", args=["web-00001"])
    response = as_auditor.get(url, {"event": f" {str(alert.pk).upper()} "})
    assert response.status_code == 302 and response.url == why_url(alert, "web-00001")
    response = as_auditor.get(url, {"event": str(alert.pk)}, headers={"HX-Request": "true"})
    assert response.headers["HX-Redirect"] == why_url(alert, "web-00001")


def test_the_why_form_says_in_place_what_is_wrong_with_the_id(as_auditor, scenario):
    url = reverse("client-why", args=["web-00001"])
    htmx = {"HX-Request": "true"}
    response = as_auditor.get(url, {"event": "not-an-id"}, headers=htmx)
    assert response.status_code == 400
    body = response.content.decode()
    assert body.lstrip().startswith('<form id="why-form"')
    assert "&#x27;not-an-id&#x27; is not an event id." in body and 'aria-invalid="true"' in body
    missing = uuid.uuid4()
    response = as_auditor.get(url, {"event": str(missing)}, headers=htmx)
    assert response.status_code == 404
    assert f"There is no event {missing}." in response.content.decode()
    whole = as_auditor.get(url, {"event": "42"})
    assert whole.status_code == 400
    page = whole.content.decode()  # the whole client page, with the error in the form
    assert "&#x27;42&#x27; is not an event id." in page and 'id="deliveries"' in page


@pytest.mark.django_db(transaction=True, databases=["default", "audit"])
def test_a_delivered_alert_shows_its_hops_and_the_delivery_row_links_to_it(
    celery_worker, as_auditor
):
    scenario = load_scenario(servers=4)
    wait_until_idle()
    alert = publish(scenario, "northwest-controller", WORM_ALERT, NORTHWEST)
    wait_until_idle()
    client_page = as_auditor.get(reverse("client", args=["web-00000"])).content.decode()
    delivery_rows = client_page.split('id="deliveries"')[1].split("</section>")[0]
    assert f'href="{why_url(alert, "web-00000")}"' in delivery_rows
    body = as_auditor.get(why_url(alert, "web-00000")).content.decode()
    assert 'data-verdict="delivered"' in body and "web-00000 got it: delivered at" in body
    route = section(body, "route")
    leaf = scenario.servers[0].dispatcher.name
    assert route.count("data-hop=") >= 1 and f'data-hop="{leaf}"' in route
    assert "<th>Delivered here</th>" in route


def test_the_event_page_asks_why_for_any_client_by_name(as_auditor, scenario):
    alert = publish(scenario, "rogue-controller", WORM_ALERT, NORTHWEST)
    page = as_auditor.get(reverse("event", args=[alert.pk])).content.decode()
    lookup = reverse("event-why-lookup", args=[alert.pk])
    assert f'action="{lookup}"' in page

    found = as_auditor.get(lookup, {"client": " web-00000 "})
    odd = as_auditor.get(lookup, {"client": "web/00000"})
    empty = as_auditor.get(lookup, {"client": ""})

    assert found.status_code == 302 and found["Location"] == why_url(alert, "web-00000")
    assert (
        odd.status_code == 404 and "no client named &#x27;web/00000&#x27;" in odd.content.decode()
    )
    assert empty.status_code == 404 and "type its name" in empty.content.decode()


def test_an_expired_trust_is_named_with_when_and_who_and_the_value_it_replaced(
    as_auditor, scenario
):
    import time
    from datetime import timedelta

    from django.utils import timezone

    from broker.services.authorities import attest_attributes

    rogue = scenario.controllers["rogue-controller"]
    attest_attributes(
        authority=scenario.trust_manager,
        client=rogue,
        grant_key=scenario.grants[("rogue-controller", "trust-manager")],
        values={"trust": 2},
        expires_at=timezone.now() + timedelta(seconds=1),
    )
    time.sleep(1.1)
    alert = publish(scenario, "rogue-controller", WORM_ALERT, NORTHWEST)
    body = as_auditor.get(why_url(alert, "web-00000")).content.decode()
    trust = section(body, "policy").split('data-clause="sender.trust"')[1].split("</tr>")[0]
    assert 'data-lapse="expired"' in trust and "trust-manager" in trust
    assert "<code>2</code>" in trust
    assert "data-replaced" in trust and "<code>1</code>" in trust and "does not come back" in trust
    assert "sender.trust is missing: its 2 from trust-manager expired at" in body
