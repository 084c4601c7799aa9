"""The second factor: a password alone reaches nothing for a role that can change
anything; enrolling shows a QR code drawn here and recovery codes once; codes are
checked, never twice, and audited; large sends, trust changes, key rotations and
grants need a code typed lately."""

import json
import time
from importlib import import_module
from urllib.parse import parse_qs, urlsplit

import pytest
from django.conf import settings
from django.test import Client
from django.urls import reverse
from django_otp.oath import hotp
from django_otp.plugins.otp_static.models import StaticToken
from django_otp.plugins.otp_totp.models import TOTPDevice

from broker.models import AuditEntry
from console.access import CODE_TYPED_AT
from demo.scenario import load_scenario
from tests.cast import (
    ADMINISTRATOR,
    AUDITOR,
    OPERATOR,
    POLICY_AUTHOR,
    TRUST_OFFICER,
    create_member,
    next_code,
)
from tests.console.conftest import logged_in

pytestmark = pytest.mark.django_db(databases=["default", "audit"])

ACTING = [OPERATOR, POLICY_AUTHOR, TRUST_OFFICER, ADMINISTRATOR]
SECOND_FACTOR = reverse("second-factor")
ATTEST_TRUST = {
    "authority": "trust-manager",
    "operation": "attest",
    "client": "northwest-controller",
    "values": "trust = 3",
}
# What a stolen password would try: pages, and actions of every acting role.
PAGES = ["/", "/fleet/", "/send/", "/policies/", "/trust/", "/audit/", "/lockouts/", "/admin/"]
ACTIONS = [
    (
        "send-go",
        {"sender": "northwest-controller", "content_name": ["kind"], "content_value": ["alert"]},
    ),
    ("policy-save", {"client": "web-00000", "text": "true"}),
    ("trust-apply", ATTEST_TRUST),
    ("lockout-lift", {"kind": "username", "value": "x"}),
]


def log_in_with_password(client, member):
    response = client.post(
        reverse("login"), {"username": member.username, "password": member.password}
    )
    assert response.status_code == 302
    return client


def type_code(client, code, next_page="/"):
    return client.post(SECOND_FACTOR, {"code": code, "next": next_page})


@pytest.mark.parametrize("member", ACTING, ids=lambda m: m.role or "admin")
def test_a_password_alone_reaches_no_page_and_no_action_of_an_acting_role(client, member):
    load_scenario(servers=1)
    create_member(member)
    log_in_with_password(client, member)
    for page in PAGES:
        response = client.get(page)
        assert response.status_code == 302, page
        assert response.url.startswith(f"{SECOND_FACTOR}?next="), page
    before = AuditEntry.objects.count()
    for name, data in ACTIONS:
        response = client.post(reverse(name), data, HTTP_HX_REQUEST="true")
        assert response.headers["HX-Redirect"].startswith(SECOND_FACTOR), name
    assert AuditEntry.objects.count() == before  # nothing was done, nor even tried


def test_an_auditor_changes_nothing_and_needs_no_second_factor(client):
    create_member(AUDITOR)
    log_in_with_password(client, AUDITOR)
    assert client.get("/audit/").status_code == 200


def copy_of_the_session_cookie(client):
    """A second client holding `client`'s session cookie, as whoever copied it holds it."""
    copy = client.__class__()
    name = settings.SESSION_COOKIE_NAME
    copy.cookies[name] = client.cookies[name].value
    return copy


def stored_session(key: str) -> dict:
    """What the session store holds under `key` (empty: no such session)."""
    return import_module(settings.SESSION_ENGINE).SessionStore(key).load()


def test_a_cookie_copied_before_the_code_is_worth_nothing_once_the_code_is_typed(client, operator):
    load_scenario(servers=1)
    log_in_with_password(client, OPERATOR)
    copied = copy_of_the_session_cookie(client)
    copied_key = copied.cookies[settings.SESSION_COOKIE_NAME].value
    assert copied.get("/fleet/").url.startswith(SECOND_FACTOR)
    assert type_code(client, next_code(OPERATOR)).status_code == 302
    for page in ("/fleet/", "/send/"):
        refused = copied.get(page)
        assert refused.status_code == 302 and refused.url.startswith(reverse("login")), page
        assert client.get(page).status_code == 200, page
    # The copied key holds nothing, least of all the mark of a code typed just now.
    assert stored_session(copied_key) == {}
    assert client.cookies[settings.SESSION_COOKIE_NAME].value != copied_key


def test_the_admins_cookie_copied_before_the_code_cannot_remove_another_users_authenticator(
    client, operator
):
    create_member(ADMINISTRATOR)
    log_in_with_password(client, ADMINISTRATOR)
    copied = copy_of_the_session_cookie(client)
    type_code(client, next_code(ADMINISTRATOR), reverse("lockouts"))
    taken = copied.post(reverse("second-factor-reset"), {"username": OPERATOR.username})
    assert taken.status_code == 302 and taken.url.startswith(reverse("login"))
    assert TOTPDevice.objects.filter(user=operator, confirmed=True).exists()
    assert not AuditEntry.objects.filter(action="operator.reset_second_factor").exists()


def csrf_token_in(response) -> str:
    """The CSRF token a page hands its forms."""
    return response.content.decode().split('name="csrfmiddlewaretoken" value="')[1].split('"')[0]


def test_typing_the_code_renews_the_csrf_token_and_the_one_before_is_refused(operator):
    client = Client(enforce_csrf_checks=True)
    login = {"username": OPERATOR.username, "password": OPERATOR.password}
    token = csrf_token_in(client.get(reverse("login")))
    assert client.post(reverse("login"), {**login, "csrfmiddlewaretoken": token}).status_code == 302
    before = csrf_token_in(client.get(SECOND_FACTOR))
    cookie_before = client.cookies[settings.CSRF_COOKIE_NAME].value
    proved = client.post(
        SECOND_FACTOR, {"code": next_code(OPERATOR), "next": "/", "csrfmiddlewaretoken": before}
    )
    assert proved.status_code == 302
    assert client.cookies[settings.CSRF_COOKIE_NAME].value != cookie_before
    assert client.post(reverse("logout"), {"csrfmiddlewaretoken": before}).status_code == 403
    after = csrf_token_in(client.get("/fleet/"))
    assert client.post(reverse("logout"), {"csrfmiddlewaretoken": after}).status_code == 302


def test_after_the_code_the_page_asked_for_opens(client, operator):
    log_in_with_password(client, OPERATOR)
    redirected = client.get("/fleet/?q=web")
    wanted = parse_qs(urlsplit(redirected.url).query)["next"][0]
    assert type_code(client, next_code(OPERATOR), wanted).url == "/fleet/?q=web"
    assert client.get("/fleet/").status_code == 200
    done = AuditEntry.objects.filter(actor="user:olivia", action="console.login")
    assert done.exists()


def test_a_wrong_code_is_refused_and_audited_and_a_used_code_works_only_once(client, operator):
    log_in_with_password(client, OPERATOR)
    refused = type_code(client, "000000")
    assert refused.status_code == 403 and "The code is wrong" in refused.content.decode()
    entry = AuditEntry.objects.using("audit").get(action="console.second_factor")
    assert entry.outcome == "refused" and entry.target == "user:olivia"
    time.sleep(1.1)  # django-otp waits a second after one wrong code
    code = next_code(OPERATOR)
    assert type_code(client, code).status_code == 302
    other = logged_out_copy(client)
    log_in_with_password(other, OPERATOR)
    assert type_code(other, code).status_code == 403


def logged_out_copy(client):
    return client.__class__()


def test_an_open_redirect_through_next_goes_home_instead(client, operator):
    log_in_with_password(client, OPERATOR)
    assert type_code(client, next_code(OPERATOR), "https://evil.example/").url == "/"


def test_enrolling_shows_a_qr_code_drawn_here_then_recovery_codes_once(client, operator):
    TOTPDevice.objects.filter(user=operator).delete()
    log_in_with_password(client, OPERATOR)
    page = client.get(SECOND_FACTOR).content.decode()
    assert 'aria-label="Main"' not in page and "data-ws-path" not in page  # no way around it
    assert '<svg width="' in page and 'class="segno"' in page and "data-secret" in page
    assert "https://" not in page.split("data-qr")[1].split("</figure>")[0]
    device = TOTPDevice.objects.get(user=operator, confirmed=False)
    assert type_code(client, "123456").status_code == 403
    time.sleep(1.1)
    code = f"{hotp(device.bin_key, int(time.time()) // 30):06d}"
    shown = type_code(client, code).content.decode()
    codes = [
        c.split("</code>")[0] for c in shown.split("data-recovery-codes")[1].split("<code>")[1:]
    ]
    assert len(codes) == 10 and "To change" not in shown
    assert client.get("/fleet/").status_code == 200
    assert TOTPDevice.objects.get(user=operator).confirmed
    assert AuditEntry.objects.filter(action="operator.enrol_second_factor").count() == 1


def test_a_recovery_code_works_once_and_its_use_is_audited(client, operator):
    TOTPDevice.objects.filter(user=operator).delete()
    log_in_with_password(client, OPERATOR)
    device = (
        TOTPDevice.objects.get(user=operator, confirmed=False)
        if client.get(SECOND_FACTOR)
        else None
    )
    shown = type_code(
        client, f"{hotp(device.bin_key, int(time.time()) // 30):06d}"
    ).content.decode()
    recovery = shown.split("data-recovery-codes")[1].split("<code>")[1].split("</code>")[0]
    other = logged_out_copy(client)
    log_in_with_password(other, OPERATOR)
    assert type_code(other, recovery).status_code == 302
    used = AuditEntry.objects.get(action="operator.use_recovery_code")
    assert used.details == {"left": 9}
    assert StaticToken.objects.filter(token=recovery).count() == 0


def make_code_stale(client):
    session = client.session
    session[CODE_TYPED_AT] = time.time() - 16 * 60
    session.save()


def test_a_trust_change_with_a_stale_code_asks_for_a_fresh_one_then_goes(client):
    load_scenario(servers=1)
    officer = logged_in(client, TRUST_OFFICER)
    make_code_stale(officer)
    asked = officer.post(reverse("trust-apply"), ATTEST_TRUST, HTTP_HX_REQUEST="true")
    assert asked.status_code == 403 and "data-needs-fresh-code" in asked.content.decode()
    assert (
        not AuditEntry.objects.filter(actor="user:trevor").exclude(action="console.login").exists()
    )
    again = officer.post(reverse("second-factor-again"), {"code": next_code(TRUST_OFFICER)})
    assert "Code accepted" in again.content.decode()
    applied = officer.post(reverse("trust-apply"), ATTEST_TRUST, HTTP_HX_REQUEST="true")
    assert "data-applied" in applied.content.decode()


def test_a_code_typed_in_place_renews_the_key_and_hands_the_page_its_new_csrf_token():
    load_scenario(servers=1)
    officer = logged_in(Client(enforce_csrf_checks=True), TRUST_OFFICER)
    page_token = csrf_token_in(officer.get(reverse("trust")))
    make_code_stale(officer)
    key_before = officer.cookies[settings.SESSION_COOKIE_NAME].value
    htmx = {"HTTP_HX_REQUEST": "true", "HTTP_X_CSRFTOKEN": page_token}
    assert officer.post(reverse("trust-apply"), ATTEST_TRUST, **htmx).status_code == 403
    again = officer.post(reverse("second-factor-again"), {"code": next_code(TRUST_OFFICER)}, **htmx)
    assert "Code accepted" in again.content.decode()
    assert officer.cookies[settings.SESSION_COOKIE_NAME].value != key_before
    assert stored_session(key_before) == {}
    new_token = json.loads(again.headers["HX-Trigger"])["csrf-renewed"]["token"]
    stale = officer.post(reverse("trust-apply"), ATTEST_TRUST, **htmx)
    assert stale.status_code == 403 and "data-needs-fresh-code" not in stale.content.decode()
    renewed = {**htmx, "HTTP_X_CSRFTOKEN": new_token}
    applied = officer.post(reverse("trust-apply"), ATTEST_TRUST, **renewed)
    assert "data-applied" in applied.content.decode()


def test_rotating_a_key_and_granting_sending_need_a_fresh_code(client):
    load_scenario(servers=1)
    admin = logged_in(client, ADMINISTRATOR)
    make_code_stale(admin)
    rotate = reverse("authority-manage", args=["trust-manager"])
    assert admin.post(rotate, {"do": "rotate"}, HTTP_HX_REQUEST="true").status_code == 403
    grant = reverse("client-sending", args=["northwest-controller"])
    holder = {"do": "grant", "holder": "user:adam"}
    assert admin.post(grant, holder, HTTP_HX_REQUEST="true").status_code == 403
    assert not AuditEntry.objects.filter(actor="user:adam").exclude(action="console.login").exists()


def test_granting_a_role_in_the_admin_with_a_stale_code_asks_for_one_first(client):
    admin = logged_in(client, ADMINISTRATOR)
    olivia = create_member(OPERATOR)
    make_code_stale(admin)
    change = f"/admin/auth/user/{olivia.pk}/change/"
    response = admin.post(change, {"username": "olivia", "is_superuser": "on"})
    assert response.status_code == 302
    assert (
        response.url
        == f"{SECOND_FACTOR}?next=%2Fadmin%2Fauth%2Fuser%2F{olivia.pk}%2Fchange%2F&again=1"
    )
    olivia.refresh_from_db()
    assert not olivia.is_superuser
    assert admin.get(change).status_code == 200  # reading it needs no fresh code


def test_a_send_above_the_threshold_with_a_stale_code_asks_for_a_fresh_one(client, settings):
    from django.contrib.auth.models import Group

    from broker.audit import Actor
    from broker.models import Event
    from broker.roles import OPERATOR as OPERATOR_ROLE
    from broker.services.sending import grant_sending
    from demo.scenario import WORM_ALERT

    settings.SEND_CONFIRM_ABOVE = 0
    scenario = load_scenario(servers=2)
    operators = Group.objects.get(name=OPERATOR_ROLE.name)
    sender = scenario.controllers["northwest-controller"]
    grant_sending(client=sender, holder=operators, actor=Actor("test", "t"))
    operator = logged_in(client, OPERATOR)
    make_code_stale(operator)
    draft = {
        "sender": sender.name,
        "content_name": list(WORM_ALERT),
        "content_value": [str(v) for v in WORM_ALERT.values()],
        "selector": 'hostname == "web-00000"',
        "lifetime_s": "60",
        "channel": "alerts",
        "confirm_count": "1",
    }
    asked = operator.post(reverse("send-go"), draft, HTTP_HX_REQUEST="true")
    assert asked.status_code == 403 and "data-needs-fresh-code" in asked.content.decode()
    assert not Event.objects.exists()
    refusal = AuditEntry.objects.using("audit").get(action="event.send", actor="user:olivia")
    assert "fresh code" in refusal.reason
    operator.post(reverse("second-factor-again"), {"code": next_code(OPERATOR)})
    sent = operator.post(reverse("send-go"), draft, HTTP_HX_REQUEST="true")
    assert sent.headers["HX-Redirect"].startswith("/events/")


def test_a_password_taken_after_the_enrolment_window_cannot_enrol_a_thiefs_phone(
    client, operator, settings
):
    from datetime import timedelta

    from django.utils import timezone

    from broker.audit import Actor
    from broker.services.operators import reset_second_factor

    TOTPDevice.objects.filter(user=operator).delete()
    long_ago = timezone.now() - timedelta(days=settings.SECOND_FACTOR_ENROL_DAYS, seconds=1)
    type(operator).objects.filter(pk=operator.pk).update(date_joined=long_ago)
    log_in_with_password(client, OPERATOR)
    closed = client.get(SECOND_FACTOR)
    assert closed.status_code == 403 and "data-enrolment-closed" in closed.content.decode()
    assert type_code(client, "123456").status_code == 403
    assert not TOTPDevice.objects.filter(user=operator).exists()
    refusal = AuditEntry.objects.using("audit").filter(action="operator.enrol_second_factor")
    assert refusal.count() == 2 and refusal.first().target == "user:olivia"
    reset_second_factor(user=operator, actor=Actor("user", "adam"))
    assert "data-qr" in client.get(SECOND_FACTOR).content.decode()


def test_the_command_opens_enrolment_for_an_admin_who_never_enrolled(client, capsys):
    from datetime import timedelta

    from django.core.management import call_command
    from django.utils import timezone

    admin = create_member(ADMINISTRATOR)
    TOTPDevice.objects.filter(user=admin).delete()
    type(admin).objects.filter(pk=admin.pk).update(date_joined=timezone.now() - timedelta(days=90))
    call_command("open_enrolment", "adam")
    assert "adam sets up a second factor" in capsys.readouterr().out
    log_in_with_password(client, ADMINISTRATOR)
    assert "data-qr" in client.get(SECOND_FACTOR).content.decode()
    entry = AuditEntry.objects.get(action="operator.reset_second_factor")
    assert entry.actor == "system:manage.py"
