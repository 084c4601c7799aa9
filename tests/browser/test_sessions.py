"""Sessions in a real Chromium against a real Uvicorn: a code typed in place renews the
session's key and CSRF token, and the page takes the new token, so that pressing the
action again goes. Screenshots go to var/artifacts."""

from __future__ import annotations

import json
import time
from importlib import import_module

import pytest
from django.conf import settings
from playwright.sync_api import expect

from broker.models import AttributeValue
from console.access import CODE_TYPED_AT
from demo.scenario import load_scenario
from tests.browser.conftest import log_in, shot
from tests.cast import TRUST_OFFICER, create_member, next_code

pytestmark = pytest.mark.django_db(transaction=True)


# Made before the page: Playwright's sync API runs an event loop in this thread.
@pytest.fixture
def officer():
    load_scenario(servers=1)
    return create_member(TRUST_OFFICER)


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
