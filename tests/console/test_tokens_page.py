"""API tokens expire, are listed with their last use, and are revoked one at a time."""

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from broker.audit import Actor
from broker.errors import AuthenticationFailed
from broker.models import AuditEntry, ClientToken, OperatorToken
from broker.services.clients import authenticate_client, issue_token
from broker.services.operators import authenticate_operator, issue_operator_token
from demo.scenario import load_scenario
from tests.cast import ADMINISTRATOR, OPERATOR, create_member
from tests.console.conftest import logged_in

pytestmark = pytest.mark.django_db(databases=["default", "audit"])

SYSTEM = Actor("test", "t")


@pytest.fixture
def server():
    return load_scenario(servers=1).servers[0]


def test_a_token_expires_after_its_lifetime_and_then_lets_no_one_in(server, settings):
    token = issue_token(client=server, actor=SYSTEM)
    record = ClientToken.objects.latest("id")
    lifetime = record.expires_at - record.created_at
    assert abs(lifetime - timedelta(days=settings.CLIENT_TOKEN_DAYS)) < timedelta(seconds=5)
    assert authenticate_client(token).name == server.name
    ClientToken.objects.filter(pk=record.pk).update(expires_at=timezone.now())
    with pytest.raises(AuthenticationFailed, match="expired"):
        authenticate_client(token)


def test_an_operator_token_expires_sooner_and_is_refused_after(settings):
    olivia = create_member(OPERATOR)
    token = issue_operator_token(user=olivia, label="soar", actor=SYSTEM)
    record = OperatorToken.objects.get()
    lifetime = record.expires_at - record.created_at
    assert abs(lifetime - timedelta(days=settings.OPERATOR_TOKEN_DAYS)) < timedelta(seconds=5)
    assert authenticate_operator(token) == olivia
    assert OperatorToken.objects.get().last_used_at is not None
    OperatorToken.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    with pytest.raises(AuthenticationFailed, match="expired"):
        authenticate_operator(token)


def test_the_page_lists_both_kinds_with_expiry_and_last_use(client, server):
    issue_token(client=server, actor=SYSTEM)
    admin = logged_in(client, ADMINISTRATOR)
    issue_operator_token(user=create_member(OPERATOR), label="soar", actor=SYSTEM)
    body = admin.get(reverse("tokens")).content.decode()
    assert body.count("data-token=") == 2 + server_tokens_of_the_scenario()
    operator_row = body.split('data-token="operator:')[1].split("</tr>")[0]
    assert "olivia" in operator_row and "soar" in operator_row and "never" in operator_row


def server_tokens_of_the_scenario() -> int:
    return ClientToken.objects.count() - 1


def test_an_operator_sees_only_their_own_operator_tokens(client, server):
    operator = logged_in(client, OPERATOR)
    issue_operator_token(user=create_member(ADMINISTRATOR), label="admin-only", actor=SYSTEM)
    assert "admin-only" not in operator.get(reverse("tokens")).content.decode()


def test_revoking_one_token_leaves_the_others_and_is_audited(client, server):
    kept, revoked = (
        issue_token(client=server, actor=SYSTEM),
        issue_token(client=server, actor=SYSTEM),
    )
    target = ClientToken.objects.latest("id")
    admin = logged_in(client, ADMINISTRATOR)
    admin.post(reverse("token-revoke"), {"kind": "client", "id": target.pk})
    assert authenticate_client(kept).name == server.name
    with pytest.raises(AuthenticationFailed):
        authenticate_client(revoked)
    entry = AuditEntry.objects.get(action="client.revoke_token")
    assert entry.actor == "user:adam" and entry.details == {"token": target.pk}
    everything = admin.get(reverse("tokens"), {"state": "all"}).content.decode()
    assert f'data-token="client:{target.pk}"' in everything and "revoked" in everything
    live = admin.get(reverse("tokens")).content.decode()
    assert f'data-token="client:{target.pk}"' not in live


def test_an_operator_may_revoke_their_own_token_but_not_anothers(client, server):
    operator = logged_in(client, OPERATOR)
    olivia = operator.get(reverse("home")).wsgi_request.user
    issue_operator_token(user=olivia, label="mine", actor=SYSTEM)
    issue_operator_token(user=create_member(ADMINISTRATOR), label="theirs", actor=SYSTEM)
    mine, theirs = (
        OperatorToken.objects.get(label="mine"),
        OperatorToken.objects.get(label="theirs"),
    )
    operator.post(reverse("token-revoke"), {"kind": "operator", "id": mine.pk})
    refused = operator.post(reverse("token-revoke"), {"kind": "operator", "id": theirs.pk})
    assert refused.status_code == 403
    mine.refresh_from_db()
    theirs.refresh_from_db()
    assert mine.revoked_at is not None and theirs.revoked_at is None


def test_an_auditor_may_read_but_not_revoke_a_clients_token(as_auditor, server):
    issue_token(client=server, actor=SYSTEM)
    token = ClientToken.objects.latest("id")
    refused = as_auditor.post(reverse("token-revoke"), {"kind": "client", "id": token.pk})
    assert refused.status_code == 403
    token.refresh_from_db()
    assert token.revoked_at is None


def test_the_page_sorts_and_pages_on_the_server(client, server):
    for _ in range(3):
        issue_token(client=server, actor=SYSTEM)
    admin = logged_in(client, ADMINISTRATOR)
    newest = admin.get(reverse("tokens"), {"sort": "newest"}).content.decode()
    first = newest.split('data-token="')[1].split('"')[0]
    assert first == f"client:{ClientToken.objects.latest('id').pk}"
    unknown = admin.get(reverse("tokens"), {"sort": "'; drop", "page": "x"})
    assert unknown.status_code == 200
