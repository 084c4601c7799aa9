"""Delivery at a leaf, driven hop by hop in this process so that events can be made to
arrive in the order a real fault produces (some held up upstream, later ones first)."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from broker import audit
from broker.audit import Actor
from broker.dispatch import delivery
from broker.dispatch import state as dispatch_state
from broker.dispatch.entry import clients_changed
from broker.dispatch.routed import live_events
from broker.dispatch.steps import DOWN, apply_client_changes, recompute_summaries, route
from broker.dispatch.summary import Summary
from broker.models import (
    AttributeValue,
    AuditEntry,
    Client,
    ClientChange,
    Delivery,
    DispatcherSummary,
)
from broker.push import to_agents
from broker.reads.clients import current_attributes
from broker.services.clients import set_clients_active, state_attributes
from broker.services.events import publish_event
from broker.services.policies import set_policy
from broker.vocabulary import vocabulary
from demo.scenario import OVERLOADED, REGIONS, load_scenario
from tests.broker.agent_helpers import ISSUER
from tests.broker.tree_helpers import events_read_through

pytestmark = pytest.mark.django_db(databases=["default", "audit"])

IIS_SELECTOR = 'receiver.software == "IIS"'


@pytest.fixture
def stream(tree_left_alone):
    """Five commands on one channel to the IIS servers, not routed yet (no worker)."""
    scenario = load_scenario(servers=4)
    events = commands(scenario.controllers["intellimune-national"], channel="ops", count=5)
    receiver = next(s for s in scenario.servers if s.name == "web-00000")
    yield receiver, events
    dispatch_state.forget_leaf(receiver.dispatcher_id)


def commands(sender, *, channel: str, count: int) -> list:
    """`count` status commands from `sender` on `channel` to the IIS servers."""
    return [
        publish_event(
            sender=sender,
            content={"kind": "command", "action": "status", "n": n},
            selector=IIS_SELECTOR,
            channel=channel,
            actor=ISSUER,
        )
        for n in range(1, count + 1)
    ]


def route_down(leaf_id: int, events) -> None:
    """As the tree's hops are routed (broker/dispatch/consumer.py): outside a
    transaction unless the caller holds one."""
    route(leaf_id, live_events([str(e.pk) for e in events]), direction=DOWN, came_from=None)


def arrive(leaf_id: int, events) -> None:
    """Route `events` down into the leaf in a transaction of the test's. With none, only
    the leaf's state is built, nothing caught up on: what is delivered after this is
    what the routed events bring."""
    with transaction.atomic():
        if events:
            route_down(leaf_id, events)
        else:
            dispatch_state.locked_leaf_state(leaf_id)


def sequences_in_position_order(receiver) -> list[int]:
    deliveries = Delivery.objects.filter(receiver=receiver).order_by("position")
    return list(deliveries.values_list("sequence", flat=True))


def test_events_missing_from_the_middle_of_a_batch_are_delivered_before_later_ones(stream):
    receiver, events = stream
    leaf = receiver.dispatcher_id
    first, second, third, fourth, fifth = events
    arrive(leaf, [first, second, fifth])  # third and fourth are held up upstream
    arrive(leaf, [third, fourth])  # they arrive late: already delivered, nothing twice
    assert sequences_in_position_order(receiver) == [1, 2, 3, 4, 5]


def test_events_missing_before_a_batch_are_delivered_first(stream):
    receiver, events = stream
    arrive(receiver.dispatcher_id, events[3:])
    arrive(receiver.dispatcher_id, events[:3])
    assert sequences_in_position_order(receiver) == [1, 2, 3, 4, 5]


# Committed transactions, so that the leaf's state, once built, has no later changes
# to catch up on.
@pytest.mark.django_db(transaction=True, databases=["default", "audit"])
def test_events_arriving_in_order_are_delivered_by_one_statement(stream):
    receiver, events = stream
    arrive(receiver.dispatcher_id, [])
    arrive(receiver.dispatcher_id, events[:1])
    with CaptureQueriesContext(connection) as queries:
        arrive(receiver.dispatcher_id, events[1:3])
    touching = [q["sql"] for q in queries if "broker_delivery" in q["sql"]]
    assert len(touching) == 1 and touching[0].lstrip().startswith("WITH input AS")
    assert sequences_in_position_order(receiver) == [1, 2, 3]


@pytest.mark.django_db(transaction=True, databases=["default", "audit"])
def test_a_receiver_behind_in_one_stream_gets_its_other_streams_in_the_same_batch(stream):
    receiver, events = stream
    arrive(receiver.dispatcher_id, [])
    other = commands(events[0].sender, channel="patches", count=2)
    arrive(receiver.dispatcher_id, [events[3], other[0]])  # ops 1-3 held up
    arrive(receiver.dispatcher_id, [other[1]])
    deliveries = Delivery.objects.filter(receiver=receiver).order_by("position")
    by_stream = [(d.channel, d.sequence) for d in deliveries]
    assert [s for c, s in by_stream if c == "ops"] == [1, 2, 3, 4]
    assert [s for c, s in by_stream if c == "patches"] == [1, 2]
    assert [d.position for d in deliveries] == list(range(1, 7))


def test_a_forged_sequence_far_ahead_in_a_stream_does_not_hold_back_the_genuine_events(stream):
    # Written into the database by whoever holds its password: a delivery moved to a
    # sequence the stream never reached. Taken for the receiver's place, every genuine
    # event after it would be skipped for this receiver, silently.
    receiver, events = stream
    arrive(receiver.dispatcher_id, events)
    Delivery.objects.filter(receiver=receiver, sequence=5).update(sequence=10**9)

    arrive(receiver.dispatcher_id, commands(events[0].sender, channel="ops", count=1))

    assert sequences_in_position_order(receiver) == [1, 2, 3, 4, 10**9, 6]
    told = AuditEntry.objects.using("audit").get(action="delivery.unbacked_sequence")
    assert told.target == "client:web-00000" and "holds sequence 1000000000" in told.reason


def test_a_forged_sequence_far_ahead_does_not_hold_back_a_receiver_behind_either(stream):
    receiver, events = stream
    arrive(receiver.dispatcher_id, events)
    Delivery.objects.filter(receiver=receiver, sequence=5).update(sequence=10**9)
    later = commands(events[0].sender, channel="ops", count=3)
    arrive(receiver.dispatcher_id, later[2:])  # the first two held up upstream: planned here
    assert sequences_in_position_order(receiver) == [1, 2, 3, 4, 10**9, 6, 7, 8]


WORM_ALERT = {"kind": "alert", "alert": "worm", "threat_level": 4}


def test_a_refusal_at_the_leaf_names_the_sender_and_each_refusing_receiver():
    scenario = load_scenario(servers=24)
    web = next(s for s in scenario.servers if s.name == "web-00000")
    rogue = scenario.controllers["rogue-controller"]  # trust 1: every server refuses it
    alerts = [
        publish_event(sender=rogue, content={**WORM_ALERT, "n": n}, selector=IIS_SELECTOR)
        for n in range(2)
    ]
    with CaptureQueriesContext(connection) as queries:
        arrive(web.dispatcher_id, alerts)
    dispatch_state.forget_leaf(web.dispatcher_id)
    here = Client.objects.filter(dispatcher_id=web.dispatcher_id, name__startswith="web-")
    iis_here = sorted(c.name for c in here if current_attributes(c)["software"] == "IIS")
    assert len(iis_here) > 1
    refusals = AuditEntry.objects.using("audit").filter(action="event.refused_by_policy")
    assert refusals.count() == 2
    for refusal in refusals:
        assert refusal.actor == "client:rogue-controller"
        assert refusal.details["receivers"] == {"names": iis_here, "unlisted": 0}
        assert refusal.reason.startswith(f"{len(iis_here)} receivers")
        # Its trust of 1 fails every branch that could admit it, whatever it sends.
        assert refusal.details["category"] == audit.SENDER_NOT_QUALIFIED
        assert refusal.details["refusers"] == len(iis_here)
    assert len([q for q in queries if _reads_client_names(q["sql"])]) == 1


def test_a_leaf_tells_a_sender_not_qualified_from_content_filtered_in_one_event():
    scenario = load_scenario(servers=24)
    web = next(s for s in scenario.servers if s.name == "web-00000")
    here = Client.objects.filter(dispatcher_id=web.dispatcher_id, name__startswith="web-")
    iis_here = sorted(c.name for c in here if current_attributes(c)["software"] == "IIS")
    strict = iis_here[0]  # qualifies only national senders, whatever they send
    set_policy(
        client=Client.objects.get(name=strict),
        text='accept sender.scope == "national"',
        actor=Actor("client", strict),
    )
    northwest = scenario.controllers["northwest-controller"]  # qualified by the others
    mild = publish_event(
        sender=northwest, content={**WORM_ALERT, "threat_level": 2}, selector=IIS_SELECTOR
    )
    arrive(web.dispatcher_id, [mild])
    dispatch_state.forget_leaf(web.dispatcher_id)
    refusals = AuditEntry.objects.using("audit").filter(
        action="event.refused_by_policy", target=f"event:{mild.pk}"
    )
    by_category = {r.details["category"]: r.details for r in refusals}
    assert by_category.keys() == {audit.SENDER_NOT_QUALIFIED, audit.CONTENT_FILTERED}
    assert by_category[audit.SENDER_NOT_QUALIFIED]["receivers"]["names"] == [strict]
    assert by_category[audit.SENDER_NOT_QUALIFIED]["refusers"] == 1
    # The scenario's policy admits the Northwest controller for alerts of level 4 or more.
    assert by_category[audit.CONTENT_FILTERED]["receivers"]["names"] == iis_here[1:]
    assert by_category[audit.CONTENT_FILTERED]["refusers"] == len(iis_here) - 1


def _reads_client_names(sql: str) -> bool:
    return (
        '"broker_client"."name" AS "name" FROM "broker_client" WHERE "broker_client"."id" IN' in sql
    )


# Committed transactions: the horizon moves past a change only once it committed.
@pytest.mark.django_db(transaction=True, databases=["default", "audit"])
def test_a_leaf_state_is_locked_and_refreshed_in_one_statement(stream):
    receiver, _ = stream
    leaf = receiver.dispatcher_id
    with transaction.atomic():
        _, changed = dispatch_state.locked_leaf_state(leaf)  # built afresh: everyone
    assert receiver.pk in changed and changed[receiver.pk] is None  # as it was: unknown
    clients_changed([receiver])  # as an attribute change logs it
    with transaction.atomic():
        state, changed = dispatch_state.locked_leaf_state(leaf)
        assert not _leaf_lock_free(leaf)  # held until the transaction ends
    assert changed.keys() == {receiver.pk} and receiver.pk in state.matcher
    attributes, _ = changed[receiver.pk]  # as the leaf held it before
    assert attributes == state.matcher.attributes(receiver.pk)
    assert _leaf_lock_free(leaf)
    with CaptureQueriesContext(connection) as queries, transaction.atomic():
        # Read again only while an older transaction still runs (the suite's others).
        assert dispatch_state.locked_leaf_state(leaf)[1].keys() <= {receiver.pk}
    (statement,) = [q["sql"] for q in queries if _locks_or_reads_changes(q["sql"])]
    assert "pg_advisory_xact_lock" in statement and "broker_clientchange" in statement


def test_a_leaf_state_that_has_not_read_the_change_log_for_a_day_is_built_afresh(stream):
    # Retention keeps two days of the log: what it dropped could have been unread here.
    receiver, _ = stream
    leaf = receiver.dispatcher_id
    with transaction.atomic():
        old, _ = dispatch_state.locked_leaf_state(leaf)
    old.last_read = replace(
        old.last_read, monotonic=old.last_read.monotonic - ClientChange.STALE_AFTER_S - 1
    )

    with transaction.atomic():
        state, changed = dispatch_state.locked_leaf_state(leaf)

    assert state is not old
    assert receiver.pk in changed and changed[receiver.pk] is None  # everyone, from unknown


@pytest.mark.django_db(transaction=True, databases=["default", "audit"])
def test_a_change_stamped_before_the_last_read_by_a_long_transaction_is_still_read(stream):
    # A change's `at` is its writer's clock when it wrote: a transaction that began
    # half an hour before the leaf's last read commits after it.
    receiver, _ = stream
    leaf = receiver.dispatcher_id
    with transaction.atomic():
        state, _ = dispatch_state.locked_leaf_state(leaf)
    change = ClientChange.objects.create(client=receiver, dispatcher_id=leaf)
    stamped = state.last_read.wall - timedelta(minutes=30)
    ClientChange.objects.filter(pk=change.pk).update(at=stamped)  # `at` is auto_now_add

    with transaction.atomic():
        _, changed = dispatch_state.locked_leaf_state(leaf)

    assert changed.keys() == {receiver.pk}


def _locks_or_reads_changes(sql: str) -> bool:
    return any(part in sql for part in ("pg_advisory", "pg_snapshot_xmin", "broker_clientchange"))


def _leaf_lock_free(leaf_id: int) -> bool:
    """Whether another connection could take the leaf's lock now."""
    import psycopg

    settings = connection.get_connection_params()
    with psycopg.connect(**settings, autocommit=True) as other:
        lock = [dispatch_state.LEAF_LOCK_NAMESPACE, leaf_id]
        taken = other.execute("SELECT pg_try_advisory_lock(%s, %s)", lock).fetchone()[0]
        if taken:
            other.execute("SELECT pg_advisory_unlock(%s, %s)", lock)
        return taken


@pytest.mark.django_db(transaction=True, databases=["default", "audit"])
def test_a_hop_outside_a_transaction_pushes_under_the_leafs_lock_and_then_releases_it(
    stream, monkeypatch
):
    receiver, events = stream
    leaf = receiver.dispatcher_id
    arrive(leaf, [])
    lock_free_at_push = []
    monkeypatch.setattr(
        to_agents, "push", lambda pushed: lock_free_at_push.append(_leaf_lock_free(leaf))
    )
    with CaptureQueriesContext(connection) as queries:
        route_down(leaf, events[:2])
    # Pushed before another process may deliver at this leaf: a receiver's pushes from
    # one leaf leave in the order of their positions.
    assert lock_free_at_push == [False]
    assert _leaf_lock_free(leaf)
    assert sequences_in_position_order(receiver) == [1, 2]
    # The connection now plans the leaf's statements once (broker.prepared.plan_once).
    with connection.cursor() as cursor:
        cursor.execute("SHOW plan_cache_mode")
        assert cursor.fetchone() == ("force_generic_plan",)
    statements = [
        q["sql"]
        for q in queries
        if _locks_or_reads_changes(q["sql"]) or "broker_delivery" in q["sql"]
    ]
    assert ["pg_advisory_lock(" in statements[0], "pg_advisory_unlock(" in statements[-1]] == [
        True,
        True,
    ]
    assert len(statements) == 3  # lock and changes, the insert, the release


@pytest.mark.django_db(transaction=True, databases=["default", "audit"])
def test_a_failure_under_the_leafs_lock_releases_it_and_forgets_the_leafs_state(
    stream, monkeypatch
):
    receiver, events = stream
    leaf = receiver.dispatcher_id
    arrive(leaf, [])

    def failing_insert(rows):
        raise RuntimeError("the insert failed")

    with monkeypatch.context() as patched:
        patched.setattr(delivery, "_insert", failing_insert)
        with pytest.raises(RuntimeError, match="the insert failed"):
            route_down(leaf, events[:1])
    assert _leaf_lock_free(leaf)
    assert leaf not in dispatch_state._leaves  # rebuilt next time, everyone caught up
    route_down(leaf, events[1:2])
    assert sequences_in_position_order(receiver) == [1, 2, 3, 4, 5]


# Persistence: a receiver that changes is given the live events it now matches. Only
# the events that may be due are read, and each receiver gets what is past its own
# position. Committed transactions, so that the leaf sees the change after its state.
@pytest.fixture
def shared_leaf(tree_left_alone):
    """The scenario with 24 servers, several to a leaf; web-00000 (IIS 2.4, not overloaded)
    and its leaf, whose state is built before anything is published."""
    scenario = load_scenario(servers=24)
    receiver = next(s for s in scenario.servers if s.name == "web-00000")
    assert current_attributes(receiver)["version"].startswith("2.4.")
    dispatch_state.forget_leaf(receiver.dispatcher_id)
    arrive(receiver.dispatcher_id, [])
    yield scenario, receiver
    dispatch_state.forget_leaf(receiver.dispatcher_id)


def delivered_events(receiver) -> list[str]:
    deliveries = Delivery.objects.filter(receiver=receiver).order_by("position")
    return [str(event_id) for event_id in deliveries.values_list("event_id", flat=True)]


def state_load(client, load: float) -> None:
    state_attributes(client=client, values={"load": load}, actor=Actor("client", client.name))


@pytest.mark.django_db(transaction=True, databases=["default", "audit"])
def test_a_changed_receiver_gets_what_it_now_matches_and_only_that_is_read(
    shared_leaf, monkeypatch
):
    scenario, receiver = shared_leaf
    national = scenario.controllers["intellimune-national"]
    status = commands(national, channel="ops", count=2)  # it matches them already
    shutdown = publish_event(
        sender=national, content={"kind": "command", "action": "shutdown"}, selector=OVERLOADED
    )
    elsewhere = next(r for r in REGIONS if r != current_attributes(receiver)["region"])
    never = publish_event(
        sender=national,
        content={"kind": "command", "action": "status"},
        selector=f'region == "{elsewhere}"',
        channel="regional",
    )
    route_down(receiver.dispatcher_id, [*status, shutdown, never])
    assert delivered_events(receiver) == [str(e.pk) for e in status]
    read = events_read_through(monkeypatch, delivery, "live_events_after")
    state_load(receiver, 0.93)  # overloaded now: the shutdown is due
    apply_client_changes(receiver.dispatcher_id)
    assert delivered_events(receiver) == [str(e.pk) for e in [*status, shutdown]]
    # Neither the commands it holds nor the event that selects another region was read.
    assert read == [str(shutdown.pk)]
    state_load(receiver, 0.97)  # a second change: nothing twice
    apply_client_changes(receiver.dispatcher_id)
    assert delivered_events(receiver) == [str(e.pk) for e in [*status, shutdown]]


@pytest.mark.django_db(transaction=True, databases=["default", "audit"])
def test_a_change_that_turns_no_live_events_verdict_leaves_them_to_their_hops(
    shared_leaf, monkeypatch
):
    scenario, receiver = shared_leaf
    on_their_way = commands(scenario.controllers["intellimune-national"], channel="ops", count=2)
    read = events_read_through(monkeypatch, delivery, "live_events_after")
    state_load(receiver, 0.5)  # still IIS: the commands select it as before
    apply_client_changes(receiver.dispatcher_id)
    assert read == [] and delivered_events(receiver) == []
    route_down(receiver.dispatcher_id, on_their_way)
    assert delivered_events(receiver) == [str(e.pk) for e in on_their_way]


@pytest.mark.django_db(transaction=True, databases=["default", "audit"])
def test_receivers_changing_together_each_get_what_is_past_their_own_position(shared_leaf):
    scenario, receiver = shared_leaf
    here = [s for s in scenario.servers if s.dispatcher_id == receiver.dispatcher_id]
    other = next(s for s in here if s != receiver)
    national = scenario.controllers["intellimune-national"]
    state_load(receiver, 0.9)
    state_load(other, 0.1)
    apply_client_changes(receiver.dispatcher_id)
    busy = [
        publish_event(
            sender=national,
            content={"kind": "command", "action": "status", "n": n},
            selector="load >= 0.5",
            channel="busy",
        )
        for n in range(2)
    ]
    route_down(receiver.dispatcher_id, busy)
    assert delivered_events(receiver) == [str(e.pk) for e in busy]
    assert delivered_events(other) == []
    state_load(receiver, 0.95)  # still busy: holds both already
    state_load(other, 0.6)  # busy now: both are due, in order
    apply_client_changes(receiver.dispatcher_id)
    assert delivered_events(receiver) == [str(e.pk) for e in busy]
    assert delivered_events(other) == [str(e.pk) for e in busy]
    assert sequences_in_position_order(other) == [1, 2]


def stored_summary(dispatcher_id: int) -> Summary:
    row = DispatcherSummary.objects.get(pk=dispatcher_id)
    return Summary.from_json(row.data, vocabulary())


@pytest.mark.django_db(transaction=True, databases=["default", "audit"])
def test_a_change_a_delivery_hop_took_in_first_still_grows_the_leafs_summary(shared_leaf):
    scenario, receiver = shared_leaf
    leaf = receiver.dispatcher_id
    dispatch_state.topology(leaf)  # the shape of this test's tree, not an earlier one's
    recompute_summaries()
    overloaded = vocabulary().selector(OVERLOADED)
    assert not stored_summary(leaf).may_select(overloaded)
    state_load(receiver, 0.93)
    # A hop arrives before the leaf's wake-up: it takes the change in, and delivers.
    route_down(leaf, commands(scenario.controllers["intellimune-national"], channel="x", count=1))
    apply_client_changes(leaf)
    assert stored_summary(leaf).may_select(overloaded)


@pytest.mark.django_db(transaction=True, databases=["default", "audit"])
def test_a_change_the_stored_summary_covers_is_not_summarised_over_the_whole_leaf(
    shared_leaf, monkeypatch
):
    scenario, receiver = shared_leaf
    leaf = receiver.dispatcher_id
    here = [s for s in scenario.servers if s.dispatcher_id == leaf and s != receiver]
    dispatch_state.topology(leaf)
    apply_client_changes(leaf)  # the state's first summary: over the whole leaf
    whole_leaf = []
    summary = dispatch_state.LeafState.summary
    monkeypatch.setattr(
        dispatch_state.LeafState, "summary", lambda s: whole_leaf.append(1) or summary(s)
    )
    state_load(receiver, current_attributes(here[0])["load"])  # a load the leaf has
    apply_client_changes(leaf)
    assert whole_leaf == []
    state_load(receiver, 0.987)  # a load no receiver had: the summary grows
    apply_client_changes(leaf)
    assert whole_leaf == [1]
    assert stored_summary(leaf).may_select(vocabulary().selector("load == 0.987"))


@pytest.mark.django_db(transaction=True, databases=["default", "audit"])
def test_a_pass_whose_stored_summary_covers_the_change_locks_no_row_and_reads_no_stamp_alone(
    shared_leaf,
):
    scenario, receiver = shared_leaf
    leaf = receiver.dispatcher_id
    here = [s for s in scenario.servers if s.dispatcher_id == leaf and s != receiver]
    dispatch_state.topology(leaf)
    apply_client_changes(leaf)
    state_load(receiver, current_attributes(here[0])["load"])  # a load the leaf has
    with CaptureQueriesContext(connection) as covered:
        apply_client_changes(leaf)
    state_load(receiver, 0.987)  # a load no receiver had: the summary grows
    with CaptureQueriesContext(connection) as grown:
        apply_client_changes(leaf)
    statements = [q["sql"] for q in covered.captured_queries]
    assert not any("FOR UPDATE" in sql for sql in statements)
    # The vocabulary's stamp comes with the receivers, selectors and summary row read.
    assert not any(sql.lstrip().startswith("SELECT (SELECT count(*)") for sql in statements)
    assert any("FOR UPDATE" in q["sql"] for q in grown.captured_queries)
    assert stored_summary(leaf).may_select(vocabulary().selector("load == 0.987"))


def test_a_leaf_holds_each_active_receiver_with_its_live_values_and_newest_policy(
    tree_left_alone,
):
    scenario = load_scenario(servers=12)
    leaf_id = scenario.servers[0].dispatcher_id
    here = list(Client.objects.filter(dispatcher_id=leaf_id, can_receive=True).order_by("pk"))
    odd = 'a "quoted" \\ back-slashed, {braced} NULL é 漢 🛡'
    state_attributes(client=here[0], values={"hostname": odd}, actor=ISSUER)
    set_clients_active(clients=here[1:2], active=False, actor=ISSUER)
    # An attested value that expired a moment ago (its expiry not yet announced).
    expired = AttributeValue.objects.filter(client=here[2], name="region").update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    assert expired == 1
    held = dispatch_state.LeafState(leaf_id)
    assert held.held_as(here[0].pk)[0]["hostname"] == odd
    assert held.held_as(here[1].pk) is None  # inactive: no receiver
    assert "region" not in held.held_as(here[2].pk)[0]
    for client in [here[0], *here[2:]]:
        attributes, policy = held.held_as(client.pk)
        assert attributes == current_attributes(client)
        newest = client.policy_versions.order_by("-version").first()
        assert policy == vocabulary().stored_policy(newest.canonical_text)
