"""Agents' logins, many at once (broker.services.agents.start_sessions)."""

import pytest

from broker.audit import Actor
from broker.errors import AuthenticationFailed
from broker.models import AuditEntry
from broker.services.agents import Login, OpenedSession, start_sessions
from broker.services.clients import create_client_model, issue_token, register_client
from demo.scenario import WEB_SERVER_ATTRIBUTES

pytestmark = pytest.mark.django_db(databases=["default", "audit"])
OPERATOR = Actor("user", "olivia")


@pytest.fixture
def servers():
    model = create_client_model(name="web-server", attributes=WEB_SERVER_ATTRIBUTES, actor=OPERATOR)
    return [
        register_client(
            name=f"web-{n}", model=model, can_send=False, can_receive=True, actor=OPERATOR
        )[0]
        for n in (1, 2)
    ]


def login(token: str, peer: str, joined: list) -> Login:
    def joining(client_id: int) -> tuple[str, str]:
        joined.append(client_id)
        return f"group-{client_id}", f"channel-of-{peer}"

    return Login(token, peer, None, None, joining=joining)


def test_a_crowd_logs_in_together_joining_once_and_a_bad_token_is_refused_alone(
    servers, django_assert_num_queries
):
    joined, joins = [], []
    tokens = [issue_token(client=server, actor=OPERATOR) for server in servers]
    logins = [login(tokens[0], "10.0.0.1:1", joined), login("junk", "10.0.0.9:9", joined)]
    logins.append(login(tokens[1], "10.0.0.2:2", joined))
    # The tokens, the refusal's audit entry (on its own connection), the streams' ends.
    with django_assert_num_queries(2), django_assert_num_queries(1, using="audit"):
        opened = start_sessions(logins, join=joins.append)
    assert joined == [servers[0].pk, servers[1].pk]
    assert joins == [
        [
            (f"group-{s.pk}", f"channel-of-10.0.0.{n}:{n}")
            for n, s in ((1, servers[0]), (2, servers[1]))
        ]
    ]
    first, refused, second = opened
    assert isinstance(refused, AuthenticationFailed)
    assert [first.client, second.client] == servers
    assert first == OpenedSession(servers[0], 0, None, [])
    entry = AuditEntry.objects.using("audit").get(action="agent.login")
    assert (entry.actor, entry.outcome) == ("agent:10.0.0.9:9", AuditEntry.Outcome.REFUSED)
