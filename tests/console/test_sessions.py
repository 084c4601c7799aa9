"""Sessions: a change of roles renews the session's key and CSRF token at the next
request, and an htmx page is handed the new token."""

import json
from importlib import import_module

import pytest
from django.conf import settings
from django.contrib.auth.models import Group
from django.test import Client
from django.urls import reverse

from broker.roles import POLICY_AUTHOR as POLICY_AUTHOR_ROLE
from tests.cast import OPERATOR, TRUST_OFFICER, create_member, log_in_proved

pytestmark = pytest.mark.django_db(databases=["default", "audit"])


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
