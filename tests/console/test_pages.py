"""Log in, navigate, log out; htmx is served from our own static files."""

import pytest
from django.contrib.staticfiles import finders
from django.urls import reverse

from tests.cast import OPERATOR, log_in_proved, next_code

pytestmark = pytest.mark.django_db(databases=["default", "audit"])


def test_pages_redirect_anonymous_visitors_to_the_login_page(client):
    response = client.get(reverse("home"))
    assert response.status_code == 302
    assert response.url == f"{reverse('login')}?next=/"


def test_operator_logs_in_with_password_then_code_and_sees_the_navigation(client, operator):
    asked = client.post(
        reverse("login"),
        {"username": OPERATOR.username, "password": OPERATOR.password},
        follow=True,
    )
    assert asked.redirect_chain[-1][0].startswith(reverse("second-factor"))
    assert 'href="/healthz"' not in asked.content.decode()
    response = client.post(reverse("second-factor"), {"code": next_code(OPERATOR)}, follow=True)
    body = response.content.decode()
    assert response.status_code == 200
    assert 'href="/healthz"' in body
    assert OPERATOR.username in body
    assert 'data-ws-path="/ws/console/"' in body


def test_wrong_password_is_refused_with_a_message(client, operator):
    response = client.post(reverse("login"), {"username": OPERATOR.username, "password": "wrong"})
    assert response.status_code == 200
    assert "didn't match" in response.content.decode()


def test_logout_is_a_post_and_ends_the_session(client, operator):
    log_in_proved(client, operator)
    response = client.post(reverse("logout"))
    assert response.status_code == 302
    assert client.get(reverse("home")).status_code == 302


def test_htmx_is_vendored_and_no_page_loads_from_a_cdn(client, operator):
    log_in_proved(client, operator)
    body = client.get(reverse("home")).content.decode()
    assert finders.find("vendor/htmx-2.0.11/htmx.min.js")
    assert 'src="/static/vendor/htmx-2.0.11/htmx.' in body
    assert "https://" not in body and "//cdn" not in body


def test_ensure_admin_creates_one_administrator_and_prints_its_password_once(capsys):
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    call_command("ensure_admin")
    first = capsys.readouterr().out
    call_command("ensure_admin")
    second = capsys.readouterr().out
    admin = get_user_model().objects.get(username="admin")
    password = first.split("password: ")[1].split()[0]
    assert admin.is_superuser and admin.check_password(password)
    assert "already exists" in second and password not in second


def test_logins_logouts_and_failed_logins_are_audited(client, operator):
    from broker.models import AuditEntry

    client.post(reverse("login"), {"username": OPERATOR.username, "password": "wrong"})
    client.post(reverse("login"), {"username": OPERATOR.username, "password": OPERATOR.password})
    client.post(reverse("logout"))
    refused = AuditEntry.objects.using("audit").get(action="console.login", outcome="refused")
    done = AuditEntry.objects.filter(actor="user:olivia", outcome="done")
    assert refused.actor == "user:olivia"
    assert sorted(done.values_list("action", flat=True)) == ["console.login", "console.logout"]


def test_the_demo_has_one_user_per_role_whose_password_is_printed_once(capsys):
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    call_command("ensure_demo_users")
    first = capsys.readouterr().out
    call_command("ensure_demo_users")
    second = capsys.readouterr().out
    users = get_user_model().objects
    for username, role in [("operator", "operator"), ("author", "policy author"),
                           ("officer", "trust officer"), ("auditor", "auditor")]:  # fmt: skip
        user = users.get(username=username)
        assert list(user.groups.values_list("name", flat=True)) == [role]
        password = first.split(f"  {username}")[1].split()[0]
        assert user.check_password(password)
    assert "users exist" in second and not any(name in second for name in ("operator ", "author "))
