"""The authoring half of the worm scenario, in a real Chromium against a real Uvicorn
and Celery worker: a policy author saves the servers' policy to every Macrocorp web
server by selector (after the live error for a wrong type); a trust officer attests
the Northwest controller's trust and later revokes it; an auditor reads everything
and every change they try is refused and audited. Screenshots go to var/artifacts."""

import pytest
from playwright.sync_api import expect

from broker.models import AttributeValue, AuditEntry, PolicyVersion
from demo.scenario import WEB_SERVER_POLICY, load_scenario
from tests.browser.conftest import log_in, shot
from tests.cast import AUDITOR, POLICY_AUTHOR, TRUST_OFFICER, create_member

pytestmark = pytest.mark.django_db(transaction=True)

MACROCORP = 'organization == "Macrocorp"'
WRONG_TYPE = 'accept sender.trust >= "two"'


@pytest.fixture
def scenario():
    return load_scenario(servers=24)


# Made before the page: Playwright's sync API runs an event loop in this thread, and
# Django refuses database calls from there.
@pytest.fixture
def author():
    return create_member(POLICY_AUTHOR)


@pytest.fixture
def officer():
    return create_member(TRUST_OFFICER)


@pytest.fixture
def auditor():
    return create_member(AUDITOR)


def test_a_policy_author_saves_the_servers_policy_to_every_macrocorp_server(
    asgi_server, celery_worker, scenario, author, page
):
    log_in(page, asgi_server, POLICY_AUTHOR)
    page.click("header nav >> text=Fleet")
    page.fill("#id_q", MACROCORP)
    expect(page.locator("[data-total]")).to_have_attribute("data-total", "24")
    shot(page, "fleet-page")
    page.click("text=Set policy…")
    expect(page.locator("[data-target-count]")).to_have_attribute("data-target-count", "24")
    page.fill("#id_policy", WRONG_TYPE)
    error = page.locator("[data-policy-error]")
    expect(error).to_have_attribute("data-column", "24")
    expect(error).to_contain_text("Line 1, column 24")
    expect(page.locator(".error-at")).to_be_visible()
    shot(page, "policy-editor-error")
    page.fill("#id_policy", WEB_SERVER_POLICY + '  or event.kind == "drill"\n')
    expect(page.locator("[data-policy-valid]")).to_be_visible()
    page.click("text=Preview the effect")
    expect(page.locator("[data-newly=accepted]")).to_be_visible()
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("text=Save to 24 receivers")
    expect(page.locator("[data-saved]")).to_have_attribute("data-saved", "24")
    shot(page, "policy-editor-saved")
    assert PolicyVersion.objects.filter(version=2, created_by="user:paula").count() == 24


def test_a_trust_officer_attests_the_northwest_controllers_trust_then_revokes_it(
    asgi_server, celery_worker, scenario, officer, page
):
    log_in(page, asgi_server, TRUST_OFFICER)
    page.click("header nav >> text=Trust")
    page.select_option("#id_authority", "trust-manager")
    page.fill("#id_client", "northwest-controller")
    page.fill("#id_values", "trust = 3")
    page.click("#trust-form button:text('Preview')")
    expect(page.locator("[data-plan]")).to_have_attribute("data-accepted", "1")
    shot(page, "trust-preview")
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#trust-form button:text('Apply')")
    expect(page.locator("[data-applied]")).to_be_visible()
    assert trust_of("northwest-controller").value == 3

    page.select_option("#id_operation", "revoke")
    page.fill("#id_values", "")
    page.fill("#id_names", "trust")
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#trust-form button:text('Apply')")
    expect(page.locator("[data-plan=revoke][data-applied]")).to_be_visible()
    shot(page, "trust-revoked")
    page.goto(f"{asgi_server}/clients/northwest-controller/")
    row = page.locator("tr[data-attribute=trust]")
    expect(row).to_contain_text("revoked")
    expect(row).to_contain_text("user:trevor")
    shot(page, "client-page")


def test_an_auditor_reads_every_page_but_every_change_is_refused_and_audited(
    asgi_server, celery_worker, scenario, auditor, page
):
    log_in(page, asgi_server, AUDITOR)
    for path, name in [("/fleet/", "fleet"), ("/clients/web-00001/", "client"),
                       ("/trust/", "trust")]:  # fmt: skip
        page.goto(f"{asgi_server}{path}")
        expect(page.locator("main h1")).to_be_visible()
        shot(page, f"auditor-{name}")
    page.fill("#id_client", "northwest-controller")
    page.fill("#id_values", "trust = 3")
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#trust-form button:text('Apply')")
    expect(page.locator("[data-refused]")).to_contain_text("trust officer")
    page.goto(f"{asgi_server}/policies/?selector={MACROCORP}")
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("text=Save to 24 receivers")
    expect(page.locator("#saved [data-refused]")).to_contain_text("policy author")
    shot(page, "auditor-refused")
    assert trust_of("northwest-controller").value == 2
    refusals = AuditEntry.objects.filter(actor="user:audrey", outcome="refused")
    assert set(refusals.values_list("action", flat=True)) == {"trust.apply", "policy.set"}


def trust_of(name: str) -> AttributeValue:
    return AttributeValue.objects.get(client__name=name, name="trust")
