"""The sending half of the worm scenario, in a real Chromium against a real Uvicorn,
Celery worker and simulated fleet (agents on real sockets that obey the commands):
the Northwest alert reaches exactly the Northwest servers; the operator previews and
sends disable-cgi and watches the acknowledgements arrive live until every vulnerable
server answered; the standing shutdown picks up a server that crosses the load
threshold later; the trust-1 controller's alert reaches no one, and the preview says
why; an auditor cannot send. Screenshots go to var/artifacts."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group
from playwright.sync_api import expect

from broker.audit import Actor
from broker.models import AttributeValue, Client, Delivery, Event
from broker.roles import OPERATOR as OPERATOR_ROLE
from broker.services.clients import state_attributes
from broker.services.sending import grant_sending
from demo.scenario import load_scenario
from tests.browser.conftest import log_in, shot
from tests.cast import AUDITOR, OPERATOR, create_member
from tests.demo.fleets import fleet_running

pytestmark = pytest.mark.django_db(transaction=True)

SERVERS = 24
LIVE_TIMEOUT_MS = 20_000


@pytest.fixture
def fleet(asgi_server, celery_worker):
    """The scenario's servers running as agents; the operators may act for every
    controller."""
    scenario = load_scenario(servers=SERVERS)
    operators = Group.objects.get(name=OPERATOR_ROLE.name)
    for controller in scenario.controllers.values():
        grant_sending(client=controller, holder=operators, actor=Actor("test", "setup"))
    with fleet_running(asgi_server, agents=SERVERS, processes=1, load_interval_s=3600):
        yield scenario


# Made before the page: Playwright's sync API runs an event loop in this thread.
@pytest.fixture
def operator():
    return create_member(OPERATOR)


@pytest.fixture
def auditor():
    return create_member(AUDITOR)


def servers_where(name: str, value) -> set[str]:
    rows = AttributeValue.objects.filter(
        name=name, value=value, revoked_at__isnull=True, client__can_receive=True
    )
    return set(rows.values_list("client__name", flat=True))


def compose(page, base_url: str, template: str) -> None:
    page.goto(f"{base_url}/send/?template={template}")
    expect(page.locator("#preview [data-addressed]")).to_be_visible()


def expect_accepting(page, count: int) -> None:
    expect(page.locator("[data-accepting]")).to_have_attribute("data-accepting", str(count))


def send_and_open(page) -> Event:
    page.click("[data-send]")
    page.wait_for_url("**/events/*/")
    return Event.objects.get(pk=page.url.rstrip("/").split("/")[-1])


def figures(page) -> dict[str, int]:
    progress = page.locator("#progress")
    names = ("targeted", "received", "acked", "failed", "waiting", "expired")
    return {name: int(progress.get_attribute(f"data-{name}")) for name in names}


def table_figures(event: Event) -> dict[str, int]:
    """The same figures, counted in the test from the deliveries table."""
    states = list(Delivery.objects.filter(event=event).values_list("state", flat=True))
    return {
        "targeted": len(states),
        "received": sum(s in ("delivered", "acked", "failed") for s in states),
        "acked": states.count("acked"),
        "failed": states.count("failed"),
        "waiting": sum(s in ("pending", "delivered") for s in states),
        "expired": states.count("expired"),
    }


def test_an_operator_plays_the_sending_half_of_the_worm_scenario(
    asgi_server, fleet, operator, page
):
    log_in(page, asgi_server, OPERATOR)

    # 1. The Northwest alert reaches exactly the Northwest servers.
    northwest = servers_where("region", "Northwest")
    compose(page, asgi_server, "worm-alert")
    expect(page.locator("[data-accepting]")).to_have_attribute(
        "data-accepting", str(len(northwest))
    )
    alert = send_and_open(page)
    expect(page.locator("#progress")).to_have_attribute(
        "data-acked", str(len(northwest)), timeout=LIVE_TIMEOUT_MS
    )
    assert set(alert.deliveries.values_list("receiver__name", flat=True)) == northwest

    # 2. disable-cgi: previewed, sent, acknowledgements watched arriving live.
    vulnerable = _vulnerable()
    compose(page, asgi_server, "disable-cgi")
    expect(page.locator("[data-accepting]")).to_have_attribute(
        "data-accepting", str(len(vulnerable))
    )
    shot(page, "send-preview-disable-cgi")
    command = send_and_open(page)
    expect(page.locator("[data-elapsed-since]")).to_contain_text(" s ago")  # ticks locally
    page.evaluate("window.__stillThisPage = true")  # a reload would lose it
    expect(page.locator("#progress")).to_have_attribute(
        "data-acked", str(len(vulnerable)), timeout=LIVE_TIMEOUT_MS
    )
    expect(page.locator("[data-all-answered]")).to_be_visible()
    assert page.evaluate("window.__stillThisPage") is True
    shot(page, "event-disable-cgi-answered")
    assert figures(page) == table_figures(command)
    assert set(command.deliveries.values_list("receiver__name", flat=True)) == vulnerable

    # 3. The standing shutdown: a server crossing the load threshold appears, once.
    compose(page, asgi_server, "shutdown")
    expect(page.locator("[data-addressed]")).to_have_attribute("data-addressed", "0")
    shutdown = send_and_open(page)
    expect(page.locator("[data-standing]")).to_be_visible()
    hot = sorted(_iis_24())[0]
    page.evaluate("window.__stillThisPage = true")
    state_attributes(client=_client(hot), values={"load": 0.93}, actor=Actor("client", hot))
    expect(page.locator("#progress")).to_have_attribute("data-acked", "1", timeout=LIVE_TIMEOUT_MS)
    assert page.evaluate("window.__stillThisPage") is True
    shot(page, "event-standing-shutdown")
    assert list(shutdown.deliveries.values_list("receiver__name", flat=True)) == [hot]
    assert figures(page) == table_figures(shutdown)

    # 4. The trust-1 controller's alert reaches no one, and the preview says why.
    compose(page, asgi_server, "worm-alert")
    page.select_option("#id_sender", "rogue-controller")
    expect_accepting(page, 0)
    expect(page.locator("[data-refusals]")).to_contain_text("sender.trust >= 2")
    expect(page.locator("[data-refusals]")).to_contain_text("sender.trust is 1")
    shot(page, "send-preview-rogue-controller")


def test_an_auditor_cannot_send(asgi_server, auditor, page):
    log_in(page, asgi_server, AUDITOR)

    expect(page.locator("header nav")).not_to_contain_text("Send")
    page.goto(f"{asgi_server}/send/")

    expect(page.locator("main")).to_contain_text("operator")
    shot(page, "send-refused-to-auditor")


def _vulnerable() -> set[str]:
    return _iis_24() & servers_where("cgi", True)


def _iis_24() -> set[str]:
    versions = AttributeValue.objects.filter(name="version").values_list("client__name", "value")
    return servers_where("software", "IIS") & {n for n, v in versions if v.startswith("2.4.")}


def _client(name: str) -> Client:
    return Client.objects.get(name=name)
