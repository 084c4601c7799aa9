"""A real Chromium logs in and watches the health page turn green through htmx."""

import pytest
from playwright.sync_api import expect

from tests.browser.conftest import log_in, shot
from tests.cast import OPERATOR

pytestmark = pytest.mark.django_db(transaction=True)


def test_operator_logs_in_and_sees_every_health_check_turn_green(
    asgi_server, celery_worker, operator, page
):
    log_in(page, asgi_server, OPERATOR)
    page.click("header nav >> text=Health")
    summary = page.locator("[data-health-state]")
    expect(summary).to_have_attribute("data-health-state", "ok", timeout=15_000)
    rows = page.locator("table.checks tbody tr.ok")
    expect(rows).to_have_count(4)
    expect(page.locator("tr[data-check='celery worker']")).to_contain_text("OK")
    # The suite's tree worker and web process announce themselves within a beat.
    tree_worker = page.locator("table.processes tr[data-process*='/tree worker/']")
    expect(tree_worker.first).to_contain_text("dispatcher.d0", timeout=15_000)
    expect(page.locator("table.processes tr[data-process*='/web/']").first).to_be_visible()
    shot(page, "health-page")


def test_the_footer_clock_ticks_over_the_websocket(asgi_server, operator, page):
    log_in(page, asgi_server, OPERATOR)
    clock = page.locator("[data-clock-time]")
    expect(clock).to_contain_text("T", timeout=10_000)
    first = clock.text_content()
    expect(clock).not_to_have_text(first, timeout=5_000)
    expect(page.locator("[data-clock-rtt]")).to_contain_text("channel layer")
