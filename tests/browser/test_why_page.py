"""Why / why not in a real Chromium against a real Uvicorn and Celery worker: from a
server's page an auditor opens why it got the Northwest alert and why it did not get
the rogue controller's, and a mistyped event id is said in place of the form.
Screenshots go to var/artifacts."""

import pytest
from playwright.sync_api import expect

from broker.models import Event
from broker.services.events import publish_event
from demo.scenario import load_scenario
from tests.broker.tree_helpers import wait_until_idle
from tests.browser.conftest import ARTIFACTS, log_in
from tests.cast import AUDITOR, create_member

pytestmark = pytest.mark.django_db(transaction=True)

WORM_ALERT = {"kind": "alert", "alert": "worm", "threat_level": 4, "target": "IIS"}
NORTHWEST = 'region == "Northwest"'


# Made before the page: Playwright's sync API runs an event loop in this thread, and
# Django refuses database calls from there.
@pytest.fixture
def alerts(celery_worker) -> dict[str, Event]:
    scenario = load_scenario(servers=8)
    wait_until_idle()
    sent = {
        sender: publish_event(
            sender=scenario.controllers[sender], content=WORM_ALERT, selector=NORTHWEST
        )
        for sender in ("northwest-controller", "rogue-controller")
    }
    wait_until_idle()
    return sent


@pytest.fixture
def auditor():
    return create_member(AUDITOR)


def shot(page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=ARTIFACTS / f"{name}.png", full_page=True)


def test_an_auditor_asks_why_a_server_got_one_alert_and_not_the_other(
    asgi_server, alerts, auditor, page
):
    log_in(page, asgi_server, AUDITOR)
    page.goto(f"{asgi_server}/clients/web-00004/")
    delivered = alerts["northwest-controller"].pk
    page.click(f'#deliveries [data-why="{delivered}"]')
    verdict = page.locator("[data-verdict]")
    expect(verdict).to_have_attribute("data-verdict", "delivered")
    expect(page.locator("#why-route [data-hop]").first).to_be_visible()
    shot(page, "why-delivered")
    page.go_back()
    refused = alerts["rogue-controller"].pk
    page.click(f'#why [data-why="{refused}"]')
    expect(verdict).to_contain_text("its policy refused the sender: sender.trust >= 2")
    expect(page.locator('[data-clause="sender.trust"]')).to_contain_text("trust-manager")
    shot(page, "why-refused")


def test_a_mistyped_event_id_is_said_in_place_of_the_form(asgi_server, alerts, auditor, page):
    log_in(page, asgi_server, AUDITOR)
    page.goto(f"{asgi_server}/clients/web-00001/")
    page.fill("#id_why_event", "not-an-id")
    page.click("#why-form button[type=submit]")
    expect(page.locator("#why-error")).to_contain_text("'not-an-id' is not an event id.")
    page.fill("#id_why_event", str(alerts["northwest-controller"].pk))
    page.click("#why-form button[type=submit]")
    expect(page.locator("[data-verdict]")).to_contain_text("web-00001 did not get it")
    expect(page).to_have_url(
        f"{asgi_server}/events/{alerts['northwest-controller'].pk}/why/web-00001/"
    )
