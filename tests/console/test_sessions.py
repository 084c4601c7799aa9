"""Sessions: those of acting roles end after SESSION_IDLE_MIN without activity and
SESSION_MAX_HOURS in all (logged out, audited, the login page says why; htmx requests
are redirected as a whole page; a page's own refreshes are no activity), the
auditor's do not; a change of roles renews the session's key and CSRF token at the
next request, and an htmx page is handed the new token. The sessions' clock is moved
by the tests (console.sessions.now)."""

import json
import time
from importlib import import_module

import pytest
from django.conf import settings
from django.contrib.auth.models import Group
from django.test import Client
from django.urls import reverse

from broker.models import AuditEntry
from broker.roles import OPERATOR as OPERATOR_ROLE
from broker.roles import POLICY_AUTHOR as POLICY_AUTHOR_ROLE
from console import sessions
from tests.cast import AUDITOR, OPERATOR, TRUST_OFFICER, create_member, log_in_proved, next_code
from tests.console.test_second_factor import log_in_with_password

pytestmark = pytest.mark.django_db(databases=["default", "audit"])

LOGIN = reverse("login")
IDLE_ENDED = "Your session ended after 30 minutes without activity; log in again."
LIFETIME_ENDED = "Your session ended: sessions last at most 12 hours; log in again."
AUTO_REFRESH = {"HTTP_HX_REQUEST": "true", "HTTP_X_AUTO_REFRESH": "1"}


class Clock:
    """The sessions' clock, moved by hand."""

    def __init__(self) -> None:
        self.at = time.time()

    def __call__(self) -> float:
        return self.at

    def advance(self, *, minutes: float = 0, hours: float = 0) -> None:
        self.at += minutes * 60 + hours * 3600


@pytest.fixture
def clock(monkeypatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(sessions, "now", clock)
    return clock


def ends_at_login_page(client, response, message: str) -> None:
    """`response` sent the user to the login page, which says `message` (once)."""
    assert response.status_code == 302 and response.url.startswith(LOGIN)
    page = client.get(response.url).content.decode()
    assert message in page and 'name="password"' in page
    assert message not in client.get(LOGIN).content.decode()


def session_ends(actor: str) -> list[dict]:
    entries = AuditEntry.objects.filter(actor=actor, action="console.session_end")
    return list(entries.values_list("details", flat=True))


def test_an_operator_idle_for_30_minutes_is_logged_out_and_the_login_page_says_why(
    as_operator, clock
):
    as_operator.get("/fleet/")
    for _ in range(3):
        clock.advance(minutes=29)
        assert as_operator.get("/fleet/").status_code == 200  # activity: it goes on
    key = session_key(as_operator)
    clock.advance(minutes=30)
    ended = as_operator.get("/fleet/?q=web")
    assert ended.url == f"{LOGIN}?next=/fleet/%3Fq%3Dweb"
    ends_at_login_page(as_operator, ended, IDLE_ENDED)
    [details] = session_ends("user:olivia")
    assert details["reason"] == "idle" and details["limit"] == "30 min idle"
    assert stored_session(key) == {}
    assert as_operator.get("/fleet/").url.startswith(LOGIN)


def test_an_operators_session_ends_12_hours_after_the_login_however_active(client, clock):
    create_member(OPERATOR)
    log_in_with_password(client, OPERATOR)
    client.post(reverse("second-factor"), {"code": next_code(OPERATOR), "next": "/"})
    for _ in range(12 * 60 // 20 - 1):
        clock.advance(minutes=20)
        assert client.get("/").status_code == 200
    clock.advance(minutes=20)
    ends_at_login_page(client, client.get("/"), LIFETIME_ENDED)
    assert session_ends("user:olivia")[0]["reason"] == "lifetime"
    log_in_with_password(client, OPERATOR)  # a new login is a new session, timed anew
    clock.advance(minutes=29)
    assert client.get(reverse("second-factor")).status_code == 200


def test_a_password_alone_idles_out_too(client, operator, clock):
    log_in_with_password(client, OPERATOR)
    client.get(reverse("second-factor"))
    clock.advance(minutes=31)
    ends_at_login_page(client, client.get(reverse("second-factor")), IDLE_ENDED)


def test_refreshes_a_page_makes_by_itself_do_not_extend_the_idle_clock(as_operator, clock):
    as_operator.get("/fleet/")
    clock.advance(minutes=20)
    assert as_operator.get("/fleet/", **AUTO_REFRESH).status_code == 200
    clock.advance(minutes=10)
    ended = as_operator.get(
        "/fleet/", HTTP_HX_CURRENT_URL="http://testserver/fleet/", **AUTO_REFRESH
    )
    assert ended.status_code == 200 and ended.headers["HX-Redirect"] == f"{LOGIN}?next=/fleet/"
    assert session_ends("user:olivia")[0]["reason"] == "idle"


def test_an_htmx_request_meeting_an_ended_session_goes_to_the_login_page_not_into_a_fragment(
    as_operator, clock
):
    as_operator.get("/fleet/")
    clock.advance(minutes=31)
    page = {"HTTP_HX_REQUEST": "true", "HTTP_HX_CURRENT_URL": "http://testserver/trust/"}
    ended = as_operator.post(reverse("trust-preview"), {"client": "x"}, **page)
    assert ended.headers["HX-Redirect"] == f"{LOGIN}?next=/trust/"
    assert b"password" not in ended.content
    # Its next one (another tab's: the session is gone) goes there too.
    again = as_operator.get("/fleet/", {"q": "true"}, **page)
    assert again.headers["HX-Redirect"] == f"{LOGIN}?next=/trust/"
    assert IDLE_ENDED in as_operator.get(again.headers["HX-Redirect"]).content.decode()


def test_an_htmx_request_from_a_page_elsewhere_is_sent_to_the_login_page_with_no_way_back(
    as_operator, clock
):
    as_operator.get("/fleet/")
    clock.advance(minutes=31)
    elsewhere = {"HTTP_HX_REQUEST": "true", "HTTP_HX_CURRENT_URL": "https://evil.example/x"}
    assert as_operator.get("/fleet/", **elsewhere).headers["HX-Redirect"] == LOGIN


def test_an_auditors_session_has_neither_limit(as_auditor, clock):
    as_auditor.get("/audit/")
    clock.advance(hours=13)
    assert as_auditor.get("/audit/").status_code == 200
    assert session_ends("user:audrey") == []


def test_an_auditor_made_operator_while_logged_in_is_timed_from_then_not_ended(client, clock):
    auditor = create_member(AUDITOR)
    log_in_with_password(client, AUDITOR)
    client.get("/audit/")
    clock.advance(hours=2)
    grant(auditor, OPERATOR_ROLE)
    assert client.get("/fleet/").url.startswith(reverse("second-factor"))
    clock.advance(minutes=29)
    assert client.get(reverse("second-factor")).status_code == 200
    assert session_ends("user:audrey") == []


def test_logging_out_is_audited_as_a_logout_not_as_an_end(as_operator):
    as_operator.post(reverse("logout"))
    assert AuditEntry.objects.filter(actor="user:olivia", action="console.logout").exists()
    assert session_ends("user:olivia") == []


def session_key(client) -> str:
    return client.cookies[settings.SESSION_COOKIE_NAME].value


def csrf_cookie(client) -> str:
    return client.cookies[settings.CSRF_COOKIE_NAME].value


def stored_session(key: str) -> dict:
    """What the session store holds under `key` (empty: no such session)."""
    return import_module(settings.SESSION_ENGINE).SessionStore(key).load()


def grant(user, role) -> None:
    user.groups.add(Group.objects.get(name=role.name))


def test_a_change_of_roles_renews_the_session_key_and_csrf_token_at_the_next_request(client):
    operator = create_member(OPERATOR)
    log_in_proved(client, operator)
    client.get("/fleet/")
    key, token = session_key(client), csrf_cookie(client)
    assert client.get("/fleet/").status_code == 200
    assert (session_key(client), csrf_cookie(client)) == (key, token)  # nothing changed
    grant(operator, POLICY_AUTHOR_ROLE)
    assert client.get("/fleet/").status_code == 200
    assert session_key(client) != key and csrf_cookie(client) != token
    assert stored_session(key) == {}  # a copy of the old cookie opens nothing
    assert client.get("/policies/").status_code == 200


def test_an_htmx_request_that_meets_a_change_of_roles_hands_the_page_the_new_token():
    client = Client(enforce_csrf_checks=True)
    officer = create_member(TRUST_OFFICER)
    log_in_proved(client, officer)
    client.get("/trust/")
    grant(officer, POLICY_AUTHOR_ROLE)
    fragment = client.get("/fleet/", {"q": "true"}, HTTP_HX_REQUEST="true")
    token = json.loads(fragment.headers["HX-Trigger"])["csrf-renewed"]["token"]
    logged_out = client.post(reverse("logout"), HTTP_X_CSRFTOKEN=token)
    assert logged_out.status_code == 302  # the token handed over is the one now accepted
