"""Guessing API tokens is bounded as guessing passwords is: too many unknown tokens
from one address lock it out with 429, even with a good token, and it is audited."""

import pytest
from django.conf import settings
from django.core.cache import cache

from broker.api import token_failures_key
from broker.audit import Actor
from broker.models import AuditEntry
from broker.services.operators import issue_operator_token
from tests.cast import ADMINISTRATOR, create_member

pytestmark = pytest.mark.django_db(databases=["default", "audit"])

GUESSER = "203.0.113.9"
ELSEWHERE = "198.51.100.20"


@pytest.fixture
def good_token():
    admin = create_member(ADMINISTRATOR)
    yield issue_operator_token(user=admin, label="soar", actor=Actor("test", "t"))
    for address in (GUESSER, ELSEWHERE):
        cache.delete(token_failures_key(address))


def list_clients(client, token, address):
    return client.get("/api/v1/clients", HTTP_AUTHORIZATION=f"Bearer {token}", REMOTE_ADDR=address)


def test_unknown_tokens_from_one_address_lock_it_out_even_for_a_good_token(client, good_token):
    answers = [
        list_clients(client, f"sno_guess{n}", GUESSER).status_code
        for n in range(settings.AXES_FAILURE_LIMIT)
    ]
    assert answers == [401] * settings.AXES_FAILURE_LIMIT
    refused = list_clients(client, good_token, GUESSER)
    assert refused.status_code == 429
    assert refused.json()["code"] == "locked_out"
    assert int(refused["Retry-After"]) == settings.AXES_COOLOFF_TIME.total_seconds()
    assert list_clients(client, good_token, ELSEWHERE).status_code == 200
    entry = AuditEntry.objects.using("audit").get(action="api.authenticate")
    assert entry.actor == f"address:{GUESSER}" and entry.details["locked_out"]


def test_fewer_failures_leave_a_good_token_working(client, good_token):
    for n in range(settings.AXES_FAILURE_LIMIT - 1):
        list_clients(client, f"sno_guess{n}", GUESSER)
    assert list_clients(client, good_token, GUESSER).status_code == 200
