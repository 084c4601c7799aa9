"""Sessions in a real Chromium against a real Uvicorn: a code typed in place renews the
session's key and CSRF token, and the page takes the new token, so that pressing the
action again goes; a page left open refreshes its live parts as requests of its own
(no activity), and when its session ends its socket closes and the page lands on the
login page, which says why. Screenshots go to var/artifacts."""

from __future__ import annotations

import json
import time
from importlib import import_module

import pytest
from django.conf import settings
from playwright.sync_api import expect

from broker.audit import Actor
from broker.models import AttributeValue, AuditEntry, Client
from broker.services.clients import state_attributes
from console.access import CODE_TYPED_AT
from console.sessions import STARTED_AT
from demo.scenario import load_scenario
from tests.browser.conftest import log_in, shot
from tests.cast import OPERATOR, TRUST_OFFICER, create_member, next_code

pytestmark = pytest.mark.django_db(transaction=True)


# Made before the page: Playwright's sync API runs an event loop in this thread.
@pytest.fixture
def officer():
    load_scenario(servers=1)
    return create_member(TRUST_OFFICER)


@pytest.fixture
def operator():
    load_scenario(servers=1)
    return create_member(OPERATOR)


def session_cookie(page) -> str:
    cookies = {cookie["name"]: cookie["value"] for cookie in page.context.cookies()}
    return cookies[settings.SESSION_COOKIE_NAME]


def change_stored_session(page, **values) -> None:
    """Write `values` into the session the browser's cookie names, as time would."""
    store = import_module(settings.SESSION_ENGINE).SessionStore(session_cookie(page))
    store.load()
    for key, value in values.items():
        store[key] = value
    store.save()


def page_csrf_tokens(page) -> set[str]:
    """Every CSRF token the page holds: its htmx headers' and its forms'."""
    headers = json.loads(page.get_attribute("body", "hx-headers"))
    inputs = page.locator("input[name=csrfmiddlewaretoken]")
    return {headers["X-CSRFToken"], *(inputs.nth(i).input_value() for i in range(inputs.count()))}


def apply_trust(page) -> None:
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#trust-form button:text('Apply')")


def test_a_code_typed_in_place_renews_the_token_and_the_action_pressed_again_goes(
    asgi_server, celery_worker, officer, page
):
    log_in(page, asgi_server, TRUST_OFFICER)
    page.goto(f"{asgi_server}/trust/")
    change_stored_session(page, **{CODE_TYPED_AT: time.time() - 16 * 60})
    key_before, tokens_before = session_cookie(page), page_csrf_tokens(page)
    page.select_option("#id_authority", "trust-manager")
    page.fill("#id_client", "northwest-controller")
    page.fill("#id_values", "trust = 3")
    apply_trust(page)
    expect(page.locator("[data-needs-fresh-code]")).to_be_visible()
    page.fill("#id_fresh_code", next_code(TRUST_OFFICER))
    page.click("[data-needs-fresh-code] button:text('Confirm')")
    expect(page.locator("[data-needs-fresh-code]")).to_contain_text("Code accepted")
    renewed = page_csrf_tokens(page)
    assert len(renewed) == 1 and renewed.isdisjoint(tokens_before)
    assert session_cookie(page) != key_before
    apply_trust(page)
    expect(page.locator("[data-plan][data-applied]")).to_be_visible()
    shot(page, "trust-applied-after-a-code-typed-in-place")
    value = AttributeValue.objects.get(client__name="northwest-controller", name="trust")
    assert value.value == 3
    page.click("header form button:text('Log out')")  # a plain form: its token was renewed
    page.wait_for_url("**/login/")


LIFETIME_ENDED = "Your session ended: sessions last at most 12 hours; log in again."


def test_a_page_left_open_refreshes_on_its_own_and_lands_on_the_login_page_when_it_ends(
    asgi_server, operator, page
):
    log_in(page, asgi_server, OPERATOR)
    # The session's lifetime ends in 15 s (the web process keeps real time).
    change_stored_session(page, **{STARTED_AT: time.time() - 12 * 3600 + 15})
    server = Client.objects.get(name="web-00000")
    page.goto(f"{asgi_server}/clients/{server.name}/")
    expect(page.locator("#server-clock")).to_have_attribute("data-watching", f"client.{server.pk}")
    with page.expect_request(lambda r: r.url.endswith(f"/clients/{server.name}/")) as refresh:
        state_attributes(client=server, values={"load": 0.9}, actor=Actor("client", "test"))
    headers = refresh.value.all_headers()
    assert headers["hx-request"] == "true" and headers["x-auto-refresh"] == "1"
    page.wait_for_url(lambda url: "/login/?next=" in url, timeout=30_000)
    expect(page.locator("[data-login-notice]")).to_have_text(LIFETIME_ENDED)
    shot(page, "login-after-the-session-ended")
    ended = AuditEntry.objects.get(actor="user:olivia", action="console.session_end")
    assert ended.details["reason"] == "lifetime"
