"""Agents' logins, many at once (broker.services.agents.start_sessions)."""

import pytest

from broker.audit import Actor
from broker.errors import AuthenticationFailed
from broker.models import AuditEntry, ReceiverStream
from broker.services.agents import Login, OpenedSession, start_sessions
from broker.services.clients import create_client_model, issue_token, register_client
from broker.services.deliveries import STREAM_CATCH_UP_MAX, confirm_receipt
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


def resuming(token: str, after_position: int) -> Login:
    return Login(token, "10.0.0.1:1", after_position, None, joining=lambda pk: ("g", "c"))


def test_an_agent_holding_positions_beyond_its_stream_moves_the_stream_past_them(servers):
    # The database was restored from a backup older than what the agent received: the
    # next delivery must be numbered past 105, or the agent drops it as one it has.
    ReceiverStream.objects.create(client=servers[0], last_position=100, confirmed_position=90)
    token = issue_token(client=servers[0], actor=OPERATOR)

    (opened,) = start_sessions([resuming(token, 105)], join=lambda joins: None)

    assert (opened.last_position, opened.after_position, opened.first_page) == (105, 105, [])
    stream = ReceiverStream.objects.get(client=servers[0])
    assert (stream.last_position, stream.confirmed_position) == (105, 105)
    entry = AuditEntry.objects.get(action="delivery.stream_caught_up")
    assert entry.target == "client:web-1"
    assert entry.details == {"from": 100, "to": 105, "agent_position": 105}
    assert confirm_receipt(client=servers[0], position=105, actor=OPERATOR).last_position == 105


def test_a_stream_never_had_and_one_claimed_far_ahead_move_by_at_most_a_million(servers):
    tokens = [issue_token(client=server, actor=OPERATOR) for server in servers]

    opened = start_sessions(
        [resuming(tokens[0], 7), resuming(tokens[1], 2**63 - 1)], join=lambda joins: None
    )

    assert [session.last_position for session in opened] == [7, STREAM_CATCH_UP_MAX]
    assert ReceiverStream.objects.get(client=servers[1]).last_position == STREAM_CATCH_UP_MAX


def test_an_agent_behind_its_stream_moves_nothing(servers):
    ReceiverStream.objects.create(client=servers[0], last_position=100, confirmed_position=90)
    token = issue_token(client=servers[0], actor=OPERATOR)

    start_sessions([resuming(token, 95)], join=lambda joins: None)

    assert ReceiverStream.objects.get(client=servers[0]).last_position == 100
    assert not AuditEntry.objects.filter(action="delivery.stream_caught_up").exists()
