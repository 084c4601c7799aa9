"""The tree page's figures against the tables they summarise, on a real tree: the real
Celery worker routes the events, PostgreSQL holds what it did."""

from collections import Counter

import pytest
from celery import current_app
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from broker.audit import Actor
from broker.dispatch.summary import Summary
from broker.dispatch.transport import inbox_depths
from broker.models import (
    Client,
    Delivery,
    Dispatcher,
    DispatcherSummary,
    Event,
    TrafficRecord,
)
from broker.reads.tree import WINDOW, DispatcherFigures, Traffic, tree_figures
from broker.services.events import publish_event
from broker.services.policies import set_policy
from broker.vocabulary import vocabulary
from demo.scenario import load_scenario
from tests.broker.tree_helpers import held_hops, release, wait_until_idle

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "audit"])

WORM_ALERT = {"kind": "alert", "alert": "worm", "threat_level": 4, "target": "IIS"}
# Selectors each of whose clauses some leaf's servers satisfy, but no one server all:
# summaries keep attributes apart, so these are sent down in vain somewhere.
UNMATCHED = [
    'software == "nginx" and version == "2.4.1"',
    'software == "Apache" and version == "1.24.0"',
    'software == "IIS" and version == "2.4.62"',
]
# A policy of many two-attribute filters: more than a summary keeps (32), and merging
# two of them accepts pairs neither accepted (action of one, threat level of the other).
MANY_FILTERS = " or ".join(
    f'(event.action == "a{n}" and event.threat_level == {n})' for n in range(36)
)


def figures_now():
    """The tree's figures as its page reads them."""
    return tree_figures(inboxes=inbox_depths())


@pytest.fixture
def scenario(celery_worker):
    scenario = load_scenario(servers=12)
    wait_until_idle()
    return scenario


def publish_the_scenario_events(scenario) -> None:
    national = scenario.controllers["intellimune-national"]
    northwest = scenario.controllers["northwest-controller"]
    publish_event(sender=northwest, content=WORM_ALERT, selector='region == "Northwest"')
    publish_event(sender=national, content={"kind": "command", "action": "disable-cgi"})
    for selector in UNMATCHED:
        command = {"kind": "command", "action": "status"}
        publish_event(sender=national, content=command, selector=selector)
    wait_until_idle()


def pre_order(parent=None) -> list[str]:
    """The dispatchers' names, each followed by its subtree, children by id."""
    names = []
    for node in Dispatcher.objects.filter(parent=parent).order_by("id"):
        names += [node.name, *pre_order(node)]
    return names


def hops_by_dispatcher(since) -> dict[str, Traffic]:
    """Each dispatcher's traffic since `since`, added up here from the raw rows."""
    totals = {}
    for record in TrafficRecord.objects.filter(at__gte=since).select_related("dispatcher"):
        seen = totals.get(record.dispatcher.name, Traffic())
        totals[record.dispatcher.name] = Traffic(
            routed=seen.routed + 1,
            forwards=seen.forwards + len(record.forwarded_to),
            wasted=seen.wasted + record.wasted,
            delivered=seen.delivered + record.delivered,
        )
    return totals


def test_the_tree_is_listed_root_first_with_each_subtree_under_its_parent(scenario):
    figures = figures_now()
    names = [node.name for node in figures.nodes]
    assert names == pre_order() == ["d0", "d0.0", "d0.0.0", "d0.0.1", "d0.1", "d0.1.0", "d0.1.1"]
    by_name = {node.name: node for node in figures.nodes}
    assert [child.name for child in by_name["d0.1"].children] == ["d0.1.0", "d0.1.1"]
    assert [node.depth for node in figures.nodes] == [0, 1, 2, 2, 1, 2, 2]
    assert {node.name for node in figures.nodes if node.is_leaf} == {
        "d0.0.0", "d0.0.1", "d0.1.0", "d0.1.1",
    }  # fmt: skip


def test_clients_are_counted_at_their_leaf_and_in_every_subtree_above(scenario):
    figures = {node.name: node for node in figures_now().nodes}
    attached = Counter(Client.objects.values_list("dispatcher__name", flat=True))
    for name, node in figures.items():
        below = sum(count for leaf, count in attached.items() if f"{leaf}.".startswith(f"{name}."))
        assert node.attached == attached.get(name, 0)
        assert node.clients == below
    assert figures["d0"].clients == Client.objects.count() == 15


def test_traffic_figures_add_up_the_traffic_records_of_the_last_minute(scenario):
    publish_the_scenario_events(scenario)
    figures = figures_now()
    expected = hops_by_dispatcher(figures.measured_at - WINDOW)
    for node in figures.nodes:
        assert node.traffic == expected.get(node.name, Traffic()), node.name
    # Hops deliver most; a receiver whose registration reaches its leaf after an event
    # gets it late, without a hop (it is not in the figures, as the page says).
    assert 0 < figures.traffic.delivered <= Delivery.objects.count()
    assert figures.traffic.wasted > 0  # the unmatched selectors went down somewhere
    assert figures.nodes[0].traffic.routed == Event.objects.count() == 5  # all pass the root


def test_traffic_older_than_the_window_is_left_out(scenario):
    publish_the_scenario_events(scenario)
    root = Dispatcher.objects.get(name="d0")
    TrafficRecord.objects.filter(dispatcher=root).update(at=timezone.now() - 2 * WINDOW)
    figures = {node.name: node for node in figures_now().nodes}
    assert figures["d0"].traffic == Traffic()
    assert figures["d0.0"].traffic.routed > 0


def test_inbox_depth_counts_the_hops_waiting_and_a_deep_inbox_is_flagged(scenario):
    publish_the_scenario_events(scenario)
    leaf = Dispatcher.objects.get(name="d0.1.0")
    held = held_hops(leaf, Event.objects.first(), 501)
    try:
        figures = {node.name: node for node in figures_now().nodes}
    finally:
        release(leaf, held)
    assert len(held) == 501
    assert {name: node.inbox for name, node in figures.items() if node.inbox} == {"d0.1.0": 501}
    assert figures["d0.1.0"].deep_inbox and figures["d0.1.0"].flagged
    assert not any(node.flagged for name, node in figures.items() if name != "d0.1.0")


def test_a_summary_is_measured_by_its_filters_constraints_and_stored_bytes(scenario):
    figures = {node.name: node for node in figures_now().nodes}
    for row in DispatcherSummary.objects.select_related("dispatcher"):
        summary = Summary.from_json(row.data, vocabulary())
        measured = figures[row.dispatcher.name].summary
        assert measured.filters == len(summary.policy_filters) == 2  # the scenario's policy
        assert measured.constraints == sum(len(f) for f in summary.policy_filters) == 7
        assert measured.exact_filters == 2 and not measured.coagulated and measured.loss == 0
        assert measured.receivers == row.data["receivers"]
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT dispatcher_id, octet_length(data::text) FROM broker_dispatchersummary"
        )
        stored_bytes = dict(cursor.fetchall())
    by_id = {node.id: node for node in figures.values()}
    assert {i: by_id[i].summary.bytes for i in stored_bytes} == stored_bytes
    assert len(stored_bytes) == 7


def test_coagulation_loss_is_what_the_summary_accepts_beyond_the_exact_filters(scenario):
    server = scenario.servers[0]
    set_policy(client=server, text=f"accept {MANY_FILTERS}", actor=Actor("client", server.name))
    wait_until_idle()
    row = DispatcherSummary.objects.get(dispatcher=server.dispatcher_id)
    exact = exact_filters_of_leaf(server.dispatcher_id)
    kept = Summary.from_json(row.data, vocabulary()).policy_filters
    assert (row.exact_filters, row.filters) == (len(exact), len(kept)) == (38, 32)
    publish_over_accepted_and_exact_events(scenario, exact, kept)
    current_app.send_task("broker.recompute_summaries")  # as the beat does every minute
    wait_until_idle()
    row.refresh_from_db()
    extra = over_accepted(Event.objects.all(), exact, kept)
    assert (row.loss_sampled, row.loss_extra) == (Event.objects.count(), extra)
    assert extra == 1
    measured = {node.id: node for node in figures_now().nodes}[server.dispatcher_id].summary
    assert measured.coagulated and measured.loss == pytest.approx(1 / 3)


def exact_filters_of_leaf(leaf_id: int) -> set:
    """The union of the current policies of the leaf's receivers, parsed here."""
    words = vocabulary()
    texts = set()
    for receiver in Client.objects.filter(dispatcher_id=leaf_id, can_receive=True):
        newest = receiver.policy_versions.order_by("-version").first()
        if newest is not None:
            texts.add(newest.text)
    return {f for text in texts for f in words.policy(text).filters()}


def over_accepted(events, exact, kept) -> int:
    """Events some kept filter accepts and no exact filter does, counted here."""
    return sum(
        any(f.accepts(e.sender_attributes, e.content) for f in kept)
        and not any(f.accepts(e.sender_attributes, e.content) for f in exact)
        for e in events
    )


def publish_over_accepted_and_exact_events(scenario, exact, kept) -> None:
    """One event only a merged filter accepts, one an exact filter accepts, one no
    filter accepts."""
    national = scenario.controllers["intellimune-national"]
    actions = {f"a{n}": n for n in range(36)}
    merged = next(f for f in kept if f not in exact)
    values = {c.name: c.value for c in merged.constraints if c.op == "in"}
    action = next(a for a in values["action"] if actions[a] != values["threat_level"][0])
    for content in (
        {"action": action, "threat_level": values["threat_level"][0]},  # over-accepted
        {"action": "a0", "threat_level": 0},  # accepted by an exact filter
        {"action": "nothing", "threat_level": 99},  # accepted by none
    ):
        publish_event(sender=national, content=content)
    wait_until_idle()


def test_a_summary_stored_before_figures_were_kept_gets_them_at_the_next_recompute(scenario):
    # Exact summaries first: one that grew while the scenario loaded may keep a moved
    # number as a range, which a recomputation lists exactly again in a new version.
    current_app.send_task("broker.recompute_summaries")
    wait_until_idle()
    DispatcherSummary.objects.update(filters=None, constraints=None, exact_filters=None)
    assert all(node.summary.filters is None for node in figures_now().nodes)
    versions = dict(DispatcherSummary.objects.values_list("dispatcher_id", "version"))
    current_app.send_task("broker.recompute_summaries")
    wait_until_idle()
    assert all(node.summary.filters == 2 for node in figures_now().nodes)
    # Only the figures were written: workers' cached copies stay valid.
    assert dict(DispatcherSummary.objects.values_list("dispatcher_id", "version")) == versions


def test_the_figures_cost_the_same_few_queries_whatever_the_traffic(scenario):
    with CaptureQueriesContext(connection) as before:
        figures_now()
    publish_the_scenario_events(scenario)
    with CaptureQueriesContext(connection) as after:
        figures_now()
    assert len(before) == len(after) == 5


@pytest.mark.parametrize(
    ("traffic", "flagged"),
    [
        (Traffic(routed=20, wasted=10), True),
        (Traffic(routed=21, wasted=10), False),  # under half of what it routed
        (Traffic(routed=9, wasted=9), False),  # too few to matter
    ],
)
def test_many_wasted_forwards_flag_a_dispatcher(traffic, flagged):
    node = DispatcherFigures(
        id=1, name="d0", depth=0, parent_id=None, is_leaf=True, attached=0, summary=None,
        inbox=0, traffic=traffic,
    )  # fmt: skip
    assert node.wasteful is flagged and node.flagged is flagged
