"""A real Chromium logs in and watches the health page turn green through htmx."""

import os
from pathlib import Path

import pytest
from playwright.sync_api import expect, sync_playwright

from tests.cast import OPERATOR

CHROMIUM = os.environ.get("CHROMIUM_PATH", "/usr/bin/chromium")
# Screenshots to look at after a run (var/ is not committed).
ARTIFACTS = Path(__file__).resolve().parents[2] / "var" / "artifacts"
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def page():
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"Chromium not found at {CHROMIUM}: run scripts/install-system-packages")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS
        )
        try:
            yield browser.new_page()
        finally:
            browser.close()


def log_in(page, base_url: str) -> None:
    page.goto(f"{base_url}/login/")
    page.fill("#id_username", OPERATOR.username)
    page.fill("#id_password", OPERATOR.password)
    page.click("button[type=submit]")
    expect(page.locator("header nav")).to_contain_text("Health")


def test_operator_logs_in_and_sees_every_health_check_turn_green(
    asgi_server, celery_worker, operator, page
):
    log_in(page, asgi_server)
    page.click("header nav >> text=Health")
    summary = page.locator("[data-health-state]")
    expect(summary).to_have_attribute("data-health-state", "ok", timeout=15_000)
    rows = page.locator("table.checks tbody tr.ok")
    expect(rows).to_have_count(4)
    expect(page.locator("tr[data-check='celery worker']")).to_contain_text("OK")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=ARTIFACTS / "health-page.png", full_page=True)


def test_the_footer_clock_ticks_over_the_websocket(asgi_server, operator, page):
    log_in(page, asgi_server)
    clock = page.locator("[data-clock-time]")
    expect(clock).to_contain_text("T", timeout=10_000)
    first = clock.text_content()
    expect(clock).not_to_have_text(first, timeout=5_000)
    expect(page.locator("[data-clock-rtt]")).to_contain_text("channel layer")
