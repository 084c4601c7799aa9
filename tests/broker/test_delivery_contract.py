"""The delivery contract of docs/protocol.md through the real stack (Uvicorn, a Celery
worker, PostgreSQL, Redis): what a worker committed but never pushed still reaches the
agent, once and in order; receipt is confirmed; what expires unconfirmed says so; and
a retried publish does not publish twice."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from datetime import timedelta
from functools import partial

import pytest
import redis
from channels.db import database_sync_to_async as in_thread
from django.utils import timezone
from sn_agent.client import Agent, AgentError

from auditchain.verification import entry_findings
from broker.dispatch import transport
from broker.dispatch.entry import send_unrouted_events
from broker.models import Delivery, Event, ReceiverStream
from broker.services.clients import issue_token
from broker.services.deliveries import (
    Answer,
    Confirmation,
    acknowledge_deliveries,
    acknowledge_delivery,
    confirm_receipt,
    confirm_receipt_while_live,
    confirm_receipts,
    expire_unconfirmed,
)
from broker.services.events import publish_event
from tests.broker.agent_helpers import ISSUER, agent_url, wait_for
from tests.broker.tree_helpers import wait_until_idle
from tests.conftest import WorkerProcess

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "audit"])

COMMAND = {"kind": "command", "action": "disable-cgi"}
IIS_SELECTOR = 'receiver.software == "IIS"'
# A channel layer no one listens on: a worker using it commits deliveries and every
# push after the commit fails, as when a worker dies between the two.
UNREACHABLE_LAYER = "unix:///nonexistent/sn-push.sock?db=0"


class PushesLost:
    """Between begin() and end() the tree runs on a worker whose pushes all fail after
    commit; the test's usual worker runs before and after."""

    def __init__(self, usual: WorkerProcess) -> None:
        self.usual = usual
        self.broken = WorkerProcess("no-push", env={"CHANNEL_LAYER_URL": UNREACHABLE_LAYER})

    def begin(self) -> None:
        self.usual.stop()
        self.broken.start()

    def end(self) -> None:
        wait_until_idle()
        self.broken.stop()
        self.usual.start()


@pytest.fixture
def pushes_lost(celery_worker):
    switch = PushesLost(celery_worker)
    yield switch
    switch.broken.stop()  # whatever happened: it must not serve later tests
    if celery_worker.process.poll() is not None:
        celery_worker.start()


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, timeout=90))


async def taken_in(agent: Agent, count: int, timeout_s: float = 30) -> list:
    """The next `count` notifications the application is handed."""
    stream = agent.notifications()
    return [await asyncio.wait_for(anext(stream), timeout_s) for _ in range(count)]


def test_deliveries_committed_but_never_pushed_reach_the_agent_once_in_order(
    asgi_server, cast, pushes_lost
):
    url = agent_url(asgi_server)

    async def flow():
        async with Agent(url, cast["server"]) as server, Agent(url, cast["controller"]) as ctl:
            await server.replayed.wait()
            await in_thread(pushes_lost.begin)()
            for n in (1, 2):
                await ctl.publish({**COMMAND, "n": n}, selector=IIS_SELECTOR, channel="ops")
            await in_thread(pushes_lost.end)()
            await ctl.publish({**COMMAND, "n": 3}, selector=IIS_SELECTOR, channel="ops")
            taken = await taken_in(server, 3)
            await asyncio.sleep(0.5)
            return taken, server._ready.qsize(), server.duplicates

    taken, left_over, _ = run(flow())
    assert [n.content["n"] for n in taken] == [1, 2, 3]
    assert [n.position for n in taken] == [1, 2, 3] and left_over == 0
    wait_for(lambda: _states(cast["server_client"]) == ["delivered"] * 3, "receipt confirmed")


def test_a_lost_push_with_nothing_after_it_is_sent_again_while_connected(
    asgi_server, cast, pushes_lost
):
    url = agent_url(asgi_server)

    async def flow():
        async with Agent(url, cast["server"]) as server, Agent(url, cast["controller"]) as ctl:
            await server.replayed.wait()
            await in_thread(pushes_lost.begin)()
            await ctl.publish(COMMAND, selector=IIS_SELECTOR)
            await in_thread(pushes_lost.end)()
            # Nothing else is published: the agent learns from its own confirmations
            # (its heartbeat) that the stream goes further than what it has.
            return await taken_in(server, 1)

    (taken,) = run(flow())
    assert taken.content == COMMAND and taken.position == 1


def test_an_agent_resuming_after_a_position_gets_only_what_follows(asgi_server, cast):
    url = agent_url(asgi_server)

    async def flow():
        async with Agent(url, cast["controller"]) as ctl:
            for n in (1, 2, 3):
                await ctl.publish({**COMMAND, "n": n}, selector=IIS_SELECTOR)
        await in_thread(wait_until_idle)()
        async with Agent(url, cast["server"], after_position=2) as server:
            return await taken_in(server, 1), server.position

    (taken,), position = run(flow())
    assert taken.content["n"] == 3 and taken.replay and position == 3


def test_an_event_that_expires_before_its_receiver_confirms_it_is_expired(cast):
    short = publish_event(
        sender=cast["controller_client"], content=COMMAND, selector=IIS_SELECTOR, lifetime_s=1
    )
    wait_until_idle()
    receiver = cast["server_client"]
    # Another IIS server confirms its copy in time; web-00000 never connects.
    other = Delivery.objects.exclude(receiver=receiver).get(event=short)
    confirm_receipt(client=other.receiver, position=other.position, actor=ISSUER)
    # Expired a moment ago, the deliveries' copy of its expiry with it.
    ended = timezone.now() - timedelta(seconds=1)
    Event.objects.filter(pk=short.pk).update(expires_at=ended)
    Delivery.objects.filter(event=short).update(expires_at=ended)
    assert expire_unconfirmed() == 1
    states = dict(Delivery.objects.filter(event=short).values_list("receiver__name", "state"))
    assert states == {receiver.name: "expired", other.receiver.name: "delivered"}


def test_an_agent_cannot_confirm_beyond_its_stream(cast):
    from broker.errors import InvalidInput

    with pytest.raises(InvalidInput) as refused:
        confirm_receipt(client=cast["server_client"], position=5, actor=ISSUER)
    assert refused.value.field == "position"


def test_a_heartbeat_confirms_marks_received_and_never_moves_the_position_back(cast):
    publish_event(sender=cast["controller_client"], content=COMMAND, selector=IIS_SELECTOR)
    publish_event(sender=cast["controller_client"], content=COMMAND, selector=IIS_SELECTOR)
    wait_until_idle()
    client, token = cast["server_client"], cast["server"]
    stream = confirm_receipt_while_live(token=token, client=client, position=2, actor=ISSUER)
    assert (stream.last_position, stream.confirmed_position) == (2, 2)
    again = confirm_receipt_while_live(token=token, client=client, position=1, actor=ISSUER)
    assert again.confirmed_position == 2
    assert ReceiverStream.objects.get(client=client).confirmed_position == 2
    states = set(Delivery.objects.filter(receiver=client).values_list("state", flat=True))
    assert states == {"delivered"}


def test_a_heartbeat_with_a_revoked_token_changes_nothing(cast):
    publish_event(sender=cast["controller_client"], content=COMMAND, selector=IIS_SELECTOR)
    wait_until_idle()
    client = cast["server_client"]
    client.tokens.update(revoked_at=timezone.now())
    gone = confirm_receipt_while_live(token=cast["server"], client=client, position=1, actor=ISSUER)
    assert gone is None
    assert Delivery.objects.get(receiver=client).state == "pending"


def test_confirmations_sharing_one_statement_each_get_their_own_outcome(cast):
    from broker.errors import InvalidInput

    for _ in range(2):  # no selector: to every web server
        publish_event(sender=cast["controller_client"], content=COMMAND)
    wait_until_idle()
    live, beyond, revoked, tokenless = _receivers_with_deliveries(count=4, each=2)
    revoked_token = issue_token(client=revoked, actor=ISSUER)
    revoked.tokens.update(revoked_at=timezone.now())
    outcomes = confirm_receipts(
        [
            Confirmation(live, 2, ISSUER, issue_token(client=live, actor=ISSUER)),
            Confirmation(beyond, 3, ISSUER, issue_token(client=beyond, actor=ISSUER)),
            Confirmation(revoked, 2, ISSUER, revoked_token),
            Confirmation(tokenless, 1, ISSUER),
        ]
    )
    assert (outcomes[0].last_position, outcomes[0].confirmed_position) == (2, 2)
    assert isinstance(outcomes[1], InvalidInput) and "beyond" in str(outcomes[1])
    assert outcomes[2] is None
    assert (outcomes[3].last_position, outcomes[3].confirmed_position) == (2, 1)
    assert _states(live) == ["delivered", "delivered"]
    assert _states(beyond) == _states(revoked) == ["pending", "pending"]
    assert _states(tokenless) == ["delivered", "pending"]
    confirmed = ReceiverStream.objects.filter(client__in=[live, beyond, revoked, tokenless])
    assert sorted(confirmed.values_list("confirmed_position", flat=True)) == [0, 0, 1, 2]


def test_two_confirmations_of_one_client_never_share_a_statement(cast):
    client = cast["server_client"]
    with pytest.raises(ValueError, match="distinct clients"):
        confirm_receipts([Confirmation(client, 0, ISSUER), Confirmation(client, 0, ISSUER)])


def _receivers_with_deliveries(*, count: int, each: int) -> list:
    """`count` receivers holding exactly `each` deliveries."""
    from broker.models import Client

    held = ReceiverStream.objects.filter(last_position=each).values_list("client_id", flat=True)
    receivers = list(Client.objects.filter(pk__in=held).order_by("name")[:count])
    assert len(receivers) == count, "the scenario has fewer receivers than the test needs"
    return receivers


def test_a_heartbeat_beyond_the_stream_is_refused_naming_the_position(cast):
    from broker.errors import InvalidInput

    for position in (5, -1, "1", True, 2**70):
        with pytest.raises(InvalidInput) as refused:
            confirm_receipt_while_live(
                token=cast["server"], client=cast["server_client"], position=position, actor=ISSUER
            )
        assert refused.value.field == "position"


def test_an_answer_is_recorded_and_audited_once_and_only_by_its_receiver(cast):
    from broker.errors import NotFound
    from broker.models import AuditEntry

    event = publish_event(sender=cast["controller_client"], content=COMMAND, selector=IIS_SELECTOR)
    wait_until_idle()
    mine = Delivery.objects.get(event=event, receiver=cast["server_client"])
    other = Delivery.objects.filter(event=event).exclude(pk=mine.pk).first()
    for _ in range(2):  # without a result, twice: the same answer
        acknowledge_delivery(client=mine.receiver, delivery_id=mine.pk, status="ok", actor=ISSUER)
    mine.refresh_from_db()
    assert (mine.state, mine.result) == ("acked", None) and mine.received_at is not None
    (entry,) = AuditEntry.objects.filter(action="delivery.ack", details__delivery=mine.pk)
    assert (entry.actor, entry.target, entry.outcome, entry.at) == (
        str(ISSUER),
        f"event:{event.pk}",
        "done",
        mine.acked_at,
    )
    assert entry.details == {"delivery": mine.pk, "state": "acked"}
    assert [f for f in entry_findings() if f.entry_id == entry.pk] == []  # its code holds
    for delivery_id in (other.pk, 2**70):
        with pytest.raises(NotFound):
            acknowledge_delivery(
                client=mine.receiver, delivery_id=delivery_id, status="ok", actor=ISSUER
            )
    assert Delivery.objects.get(pk=other.pk).state == "pending"


def test_answers_sharing_one_statement_each_get_their_own_outcome_and_audit(cast):
    from broker.errors import InvalidInput, NotFound
    from broker.models import AuditEntry

    for _ in range(2):
        publish_event(sender=cast["controller_client"], content=COMMAND)
    wait_until_idle()
    first, second = Delivery.objects.filter(receiver=cast["server_client"]).order_by("position")
    other = Delivery.objects.exclude(receiver=cast["server_client"]).first()
    acknowledge_delivery(client=first.receiver, delivery_id=first.pk, status="ok", actor=ISSUER)
    mine = partial(Answer, cast["server_client"], actor=ISSUER)
    outcomes = acknowledge_deliveries(
        [
            mine(second.pk, "failed", {"exit": 3}),
            mine(first.pk, "ok", None),  # the same answer again: nothing changes
            mine(other.pk, "ok", None),  # another receiver's
            mine(2**70, "ok", None),
            mine(10**9, "maybe", None),  # no such status (nor delivery)
        ]
    )
    assert outcomes[:2] == [None, None]
    assert [type(o) for o in outcomes[2:]] == [NotFound, NotFound, InvalidInput]
    changed = acknowledge_deliveries([mine(first.pk, "failed", None)])
    assert isinstance(changed[0], InvalidInput) and "already answered (acked)" in str(changed[0])
    second.refresh_from_db()
    assert (second.state, second.result) == ("failed", {"exit": 3})
    done = AuditEntry.objects.filter(action="delivery.ack", outcome="done")
    assert sorted(done.values_list("details__delivery", flat=True)) == [first.pk, second.pk]
    refused = AuditEntry.objects.filter(action="delivery.ack").exclude(outcome="done")
    assert refused.count() == 4


def test_two_answers_to_one_delivery_never_share_a_statement(cast):
    answer = Answer(cast["server_client"], 1, "ok", None, ISSUER)
    with pytest.raises(ValueError, match="distinct deliveries"):
        acknowledge_deliveries([answer, answer])


def test_publishing_again_with_the_same_idempotency_key_returns_the_first_event(asgi_server, cast):
    url = agent_url(asgi_server)

    async def flow():
        async with Agent(url, cast["controller"]) as ctl:
            first = await ctl.publish(COMMAND, selector=IIS_SELECTOR, idempotency_key="cmd-42")
            again = await ctl.publish(COMMAND, selector=IIS_SELECTOR, idempotency_key="cmd-42")
            with pytest.raises(AgentError) as refused:
                await ctl.publish({"kind": "command"}, idempotency_key="cmd-42")
            return first, again, refused.value

    first, again, refused = run(flow())
    assert (first["event"], first["sequence"]) == (again["event"], again["sequence"])
    assert Event.objects.filter(idempotency_key="cmd-42").count() == 1
    assert (refused.code, refused.field) == ("invalid", "idempotency_key")


def test_the_http_api_honours_the_idempotency_key_header(asgi_server, cast):
    def post() -> dict:
        request = urllib.request.Request(
            asgi_server + "/api/v1/events",
            data=json.dumps({"content": COMMAND}).encode(),
            method="POST",
            headers={
                "Content-Type": "application/json",
                "Authorization": f"Bearer {cast['controller']}",
                "Idempotency-Key": "soar-incident-7",
            },
        )
        with urllib.request.urlopen(request, timeout=20) as response:
            return json.loads(response.read())

    assert post()["event"] == post()["event"]
    assert Event.objects.filter(idempotency_key="soar-incident-7").count() == 1


def test_a_publish_whose_first_hop_is_lost_after_commit_still_succeeds(cast, monkeypatch):
    # Redis gone between the commit and the first hop: the event is committed, so the
    # publisher is told it was published; the sweep sends the hop again.
    gone = redis.Redis(unix_socket_path="/nonexistent.sock")
    monkeypatch.setattr(transport, "broker_redis", lambda: gone)
    event = publish_event(sender=cast["controller_client"], content=COMMAND, actor=ISSUER)
    monkeypatch.undo()
    wait_until_idle()
    event.refresh_from_db()
    assert event.routed_at is None
    assert not Delivery.objects.filter(event=event).exists()
    # What the periodic sweep does: the event is routed after all, once.
    assert send_unrouted_events(older_than=timedelta(0)) == 1
    assert send_unrouted_events(older_than=timedelta(0)) == 0
    wait_until_idle()
    assert Delivery.objects.filter(event=event).exists()


def _states(client) -> list[str]:
    deliveries = Delivery.objects.filter(receiver=client).order_by("position")
    return list(deliveries.values_list("state", flat=True))


def test_positions_number_each_receivers_deliveries_without_gaps(cast):
    sender = cast["controller_client"]
    for n in range(5):
        publish_event(sender=sender, content={**COMMAND, "n": n}, selector=IIS_SELECTOR)
    wait_until_idle()
    for receiver_id, positions in _positions_by_receiver().items():
        assert positions == list(range(1, len(positions) + 1)), receiver_id
        assert ReceiverStream.objects.get(client_id=receiver_id).last_position == len(positions)


def _positions_by_receiver() -> dict[int, list[int]]:
    found: dict[int, list[int]] = {}
    for receiver, position in Delivery.objects.order_by("receiver", "position").values_list(
        "receiver", "position"
    ):
        found.setdefault(receiver, []).append(position)
    return found
