"""Every page of the console, opened in a real Chromium against a real Uvicorn, runs
with no Content-Security-Policy violation (the page fixture fails a test on any), and
sends the policy with every response. A new page must be added here: the test fails
while the console has a page it does not open."""

import pytest
from django.urls import URLPattern, reverse
from django_otp.plugins.otp_totp.models import TOTPDevice
from playwright.sync_api import expect

from broker.models import Event
from broker.services.events import publish_event
from console.urls import urlpatterns
from demo.scenario import WORM_ALERT, load_scenario
from reports.jobs import KINDS
from tests.broker.tree_helpers import wait_until_idle
from tests.browser.conftest import log_in, shot
from tests.cast import ADMINISTRATOR, POLICY_AUTHOR, create_member

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "audit"])

SERVER = "web-00000"
# Console URLs that are not pages: form posts, fragments and downloads.
NOT_PAGES = {
    "health-json", "metrics", "fleet-bulk", "client-tokens", "client-sending", "client-why",
    "event-why-lookup", "policy-check", "policy-preview", "policy-save", "trust-preview",
    "trust-apply", "authority-manage", "send-preview", "send-go", "event-resend",
    "audit-export", "report-run", "report-csv", "lockout-lift", "logout", "login",
    "second-factor-again", "token-revoke", "second-factor-reset",
}  # fmt: skip
ADMIN_PAGES = ["/admin/", "/admin/auth/user/", "/admin/broker/client/", "/admin/auth/group/"]


PAGE_NAMES = {
    "home", "health", "fleet", "client", "event-why", "policy-editor", "tree", "trust",
    "send", "events", "event", "audit-log", "reports", "report", "lockouts",
    "second-factor", "tokens",
}  # fmt: skip


def page_paths(event: Event) -> dict[str, list[str]]:
    """Each console page's name (PAGE_NAMES) and the paths that open it."""
    one = {
        "home": [], "health": [], "fleet": [], "client": [SERVER],
        "event-why": [event.pk, SERVER], "policy-editor": [], "tree": [], "trust": [],
        "send": [], "events": [], "event": [event.pk], "audit-log": [], "reports": [],
        "lockouts": [], "second-factor": [], "tokens": [],
    }  # fmt: skip
    paths = {name: [reverse(name, args=args)] for name, args in one.items()}
    paths["report"] = [reverse("report", args=[kind]) for kind in KINDS]
    return paths


# Made before the page: Playwright's sync API runs an event loop in this thread.
@pytest.fixture
def event(celery_worker) -> Event:
    scenario = load_scenario(servers=4)
    create_member(ADMINISTRATOR)
    sent = publish_event(sender=scenario.controllers["northwest-controller"], content=WORM_ALERT)
    wait_until_idle()
    return sent


def test_every_console_page_is_listed_here():
    named = {pattern.name for pattern in urlpatterns if isinstance(pattern, URLPattern)}
    assert named - NOT_PAGES == PAGE_NAMES


def test_every_page_opens_with_no_policy_violation(asgi_server, event, page):
    login = page.goto(f"{asgi_server}/login/")
    assert "default-src 'none'" in login.headers["content-security-policy"]
    log_in(page, asgi_server, ADMINISTRATOR)
    paths_by_page = page_paths(event)
    assert set(paths_by_page) == PAGE_NAMES
    for name, paths in paths_by_page.items():
        for path in paths:
            response = page.goto(f"{asgi_server}{path}")
            assert response.status == 200, path
            assert "script-src 'self'" in response.headers["content-security-policy"], path
            page.wait_for_load_state("networkidle")
            expect(page.locator("main")).to_be_visible()
        shot(page, f"csp-{name}")
    for path in ADMIN_PAGES:
        response = page.goto(f"{asgi_server}{path}")
        assert response.status == 200, path
        page.wait_for_load_state("networkidle")


def test_enrolling_a_second_factor_shows_its_qr_code_with_no_policy_violation(
    asgi_server, newcomer, page
):
    page.goto(f"{asgi_server}/login/")
    page.fill("#id_username", POLICY_AUTHOR.username)
    page.fill("#id_password", POLICY_AUTHOR.password)
    page.click("button[type=submit]")
    expect(page.locator("[data-qr] svg")).to_be_visible()
    shot(page, "second-factor-enrolment")


@pytest.fixture
def newcomer(db):
    """Paula, a policy author who has not enrolled an authenticator yet."""
    TOTPDevice.objects.filter(user=create_member(POLICY_AUTHOR)).delete()
