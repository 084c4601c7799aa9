"""A real Chromium (Debian's) driven by Playwright, and how the tests log in."""

import os
from pathlib import Path

import pytest
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import expect, sync_playwright

from tests.cast import next_code

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


@pytest.fixture
def page(monkeypatch):
    # Playwright's sync API keeps an event loop in this thread, so Django takes the
    # test's own database reads for async code; nothing else runs here meanwhile.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"Chromium not found at {CHROMIUM}: run scripts/install-system-packages")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS
        )
        try:
            # A laptop screen: the pages must be usable at this size.
            opened = browser.new_page(viewport={"width": 1366, "height": 800})
            refused = csp_violations(opened)
            yield opened
            assert not refused, "Content-Security-Policy violations:\n" + "\n".join(refused)
        finally:
            browser.close()


def csp_violations(page) -> list[str]:
    """What the page's Content-Security-Policy refused, from now on, on every document
    the page opens (Chromium reports each refusal on the console), as "URL: message"."""
    refused: list[str] = []

    def note(message) -> None:
        if "Content Security Policy" in message.text:
            refused.append(f"{page.url}: {message.text}")

    page.on("console", note)
    return refused


def log_in(page, base_url: str, member) -> None:
    """Log `member` in through the login form, and their second factor's page when
    their role asks for it (a code of the authenticator tests.cast gave them)."""
    page.goto(f"{base_url}/login/")
    page.fill("#id_username", member.username)
    page.fill("#id_password", member.password)
    page.click("button[type=submit]")
    page.wait_for_url(lambda url: "/login/" not in url)
    if "/account/second-factor/" in page.url:
        page.fill("#id_code", next_code(member))
        page.click("#second-factor-form button[type=submit]")
    expect(page.locator("header nav")).to_contain_text("Health")


def shot(page, name: str) -> None:
    """Save a full-page screenshot as an artifact to look at (var/artifacts/NAME.png)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=ARTIFACTS / f"{name}.png", full_page=True)


def element_shot(locator, name: str, attempts: int = 3) -> None:
    """Save a screenshot of one element as an artifact. A live region may swap the
    element for a fresh copy while it is being taken (a trailing update): then the
    locator finds the new one and the shot is taken again."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for attempt in range(1, attempts + 1):
        try:
            locator.screenshot(path=ARTIFACTS / f"{name}.png")
            return
        except PlaywrightError as error:
            if "not attached to the DOM" not in str(error) or attempt == attempts:
                raise
