"""Password guessing locks a username or an address out (django-axes), even against the
right password; an admin sees and lifts lockouts; all of it is audited."""

from datetime import timedelta

import pytest
from axes.models import AccessAttempt
from django.conf import settings
from django.test import override_settings
from django.urls import reverse

from broker.models import AuditEntry
from tests.cast import ADMINISTRATOR, OPERATOR, POLICY_AUTHOR, Member, create_member
from tests.console.conftest import logged_in

pytestmark = pytest.mark.django_db(databases=["default", "audit"])

ATTACKER = "203.0.113.66"
ELSEWHERE = "198.51.100.7"


def attempt(client, member, password, *, address=ATTACKER):
    return client.post(
        reverse("login"),
        {"username": member.username, "password": password},
        REMOTE_ADDR=address,
    )


def guess(client, member, times, *, address=ATTACKER):
    for number in range(times):
        attempt(client, member, f"guess-{number}", address=address)


def test_ten_wrong_passwords_lock_the_user_out_even_with_the_right_one(client, operator):
    guess(client, OPERATOR, settings.AXES_FAILURE_LIMIT - 1)
    assert attempt(client, OPERATOR, "still-wrong").status_code == 429
    refused = attempt(client, OPERATOR, OPERATOR.password, address=ELSEWHERE)
    assert refused.status_code == 429
    assert "Too many failed logins" in refused.content.decode()
    assert "_auth_user_id" not in client.session


def test_nine_wrong_passwords_still_let_the_right_one_in(client, operator):
    guess(client, OPERATOR, settings.AXES_FAILURE_LIMIT - 1)
    assert attempt(client, OPERATOR, OPERATOR.password).status_code == 302


def test_guessing_many_usernames_from_one_address_locks_the_address_out(client, operator):
    create_member(POLICY_AUTHOR)
    for number in range(settings.AXES_FAILURE_LIMIT):
        stranger = Member(f"u{number}", "x")
        attempt(client, stranger, "x")
    assert attempt(client, POLICY_AUTHOR, POLICY_AUTHOR.password).status_code == 429
    assert attempt(client, OPERATOR, OPERATOR.password, address=ELSEWHERE).status_code == 302


def test_failures_older_than_the_cool_off_no_longer_count(client, operator):
    guess(client, OPERATOR, settings.AXES_FAILURE_LIMIT)
    long_ago = AccessAttempt.objects.get().attempt_time - settings.AXES_COOLOFF_TIME
    AccessAttempt.objects.update(attempt_time=long_ago - timedelta(seconds=1))
    assert attempt(client, OPERATOR, OPERATOR.password).status_code == 302


def test_failures_and_refusals_while_locked_out_are_audited(client, operator):
    guess(client, OPERATOR, settings.AXES_FAILURE_LIMIT + 2)
    entries = AuditEntry.objects.using("audit").filter(action="console.login", actor="user:olivia")
    wrong = entries.filter(reason="wrong username or password")
    locked = entries.filter(details__locked_out=True)
    assert (wrong.count(), locked.count()) == (settings.AXES_FAILURE_LIMIT - 1, 3)
    assert locked.first().details["address"] == ATTACKER


def test_an_admin_sees_a_lockout_and_lifts_it_and_the_user_logs_in_again(client, operator):
    guess(client, OPERATOR, settings.AXES_FAILURE_LIMIT)
    admin = logged_in(client.__class__(), ADMINISTRATOR)
    page = admin.get(reverse("lockouts")).content.decode()
    assert 'data-lockout="username:olivia"' in page
    assert f'data-lockout="address:{ATTACKER}"' in page
    admin.post(reverse("lockout-lift"), {"kind": "username", "value": "olivia"})
    admin.post(reverse("lockout-lift"), {"kind": "address", "value": ATTACKER})
    assert "No username or address is locked out" in admin.get(reverse("lockouts")).content.decode()
    assert attempt(client, OPERATOR, OPERATOR.password).status_code == 302
    lifted = AuditEntry.objects.filter(action="console.lift_lockout", actor="user:adam")
    assert sorted(lifted.values_list("target", flat=True)) == [
        f"address:{ATTACKER}",
        "username:olivia",
    ]


def test_an_unknown_kind_of_lockout_is_said_and_nothing_is_lifted(client, operator):
    guess(client, OPERATOR, settings.AXES_FAILURE_LIMIT)
    admin = logged_in(client, ADMINISTRATOR)
    page = admin.post(reverse("lockout-lift"), {"kind": "user", "value": "olivia"}, follow=True)
    assert "a lockout is of a username or an address" in page.content.decode()
    assert AccessAttempt.objects.exists()


def test_only_an_admin_may_see_or_lift_lockouts(as_operator):
    assert as_operator.get(reverse("lockouts")).status_code == 403
    lifted = as_operator.post(reverse("lockout-lift"), {"kind": "username", "value": "olivia"})
    assert lifted.status_code == 403
    assert "Lockouts" not in as_operator.get(reverse("home")).content.decode()


def test_a_forged_forwarded_for_header_does_not_change_the_address(client, operator):
    for number in range(settings.AXES_FAILURE_LIMIT):
        client.post(
            reverse("login"),
            {"username": f"u{number}", "password": "x"},
            REMOTE_ADDR=ATTACKER,
            HTTP_X_FORWARDED_FOR=f"10.0.0.{number}",
        )
    assert attempt(client, OPERATOR, OPERATOR.password).status_code == 429


@override_settings(TRUSTED_PROXY_COUNT=1)
def test_behind_one_proxy_the_address_is_the_one_the_proxy_saw(client, operator):
    for number in range(settings.AXES_FAILURE_LIMIT):
        client.post(
            reverse("login"),
            {"username": f"u{number}", "password": "x"},
            REMOTE_ADDR="10.0.0.1",  # the proxy
            HTTP_X_FORWARDED_FOR=f"1.2.3.4, {ATTACKER}",  # the client chose the first
        )
    from_attacker = {"REMOTE_ADDR": "10.0.0.1", "HTTP_X_FORWARDED_FOR": ATTACKER}
    from_elsewhere = {"REMOTE_ADDR": "10.0.0.1", "HTTP_X_FORWARDED_FOR": ELSEWHERE}
    login = {"username": OPERATOR.username, "password": OPERATOR.password}
    assert client.post(reverse("login"), login, **from_attacker).status_code == 429
    assert client.post(reverse("login"), login, **from_elsewhere).status_code == 302


def test_the_admin_sees_who_enrolled_a_second_factor_and_resets_a_lost_one(client, operator):
    from django_otp.plugins.otp_totp.models import TOTPDevice

    from tests.console.test_second_factor import make_code_stale

    admin = logged_in(client, ADMINISTRATOR)
    page = admin.get(reverse("lockouts")).content.decode()
    row = page.split('data-user="olivia"')[1].split("</tr>")[0]
    assert "operator" in row and "enrolled" in row
    admin.post(reverse("second-factor-reset"), {"username": "olivia"})
    assert not TOTPDevice.objects.filter(user=operator, confirmed=True).exists()
    assert AuditEntry.objects.get(action="operator.reset_second_factor").target == "user:olivia"
    make_code_stale(admin)
    create_member(POLICY_AUTHOR)
    stale = admin.post(
        reverse("second-factor-reset"),
        {"username": "paula"},
        HTTP_REFERER="http://testserver/lockouts/",
    )
    assert stale.url == "/account/second-factor/?next=%2Flockouts%2F&again=1"
    assert TOTPDevice.objects.filter(user__username="paula").exists()
