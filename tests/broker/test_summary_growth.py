"""A child's summary grew: its parent resends the live events the old summary kept
from it, and reads only the events the growth may concern."""

import pytest

from broker.dispatch import state as dispatch_state
from broker.dispatch import steps
from broker.dispatch.summary import Summary
from broker.dispatch.transport import RouteHop
from broker.models import Dispatcher, DispatcherSummary
from broker.services.clients import state_attributes
from broker.services.events import publish_event
from broker.vocabulary import vocabulary
from demo.scenario import WEB_SERVER_POLICY, load_scenario
from tests.broker.agent_helpers import ISSUER
from tests.broker.tree_helpers import events_read_through

pytestmark = pytest.mark.django_db(databases=["default", "audit"])

IIS = {"software": "IIS", "version": "2.4.1", "load": 0.1, "region": "Northwest"}


def summary_of(*receivers: dict) -> Summary:
    """A subtree of web servers with these attributes and the scenario's policy."""
    policy = vocabulary().policy(WEB_SERVER_POLICY)
    return Summary.of_receivers([(attributes, policy) for attributes in receivers])


@pytest.fixture
def commands(tree_left_alone):
    """A status command to IIS servers and one to loaded servers, both live."""
    national = load_scenario(servers=4).controllers["intellimune-national"]
    content = {"kind": "command", "action": "status"}
    return [
        publish_event(sender=national, content=content, selector=selector, actor=ISSUER)
        for selector in ('software == "IIS"', "load >= 0.8")
    ]


def test_a_child_that_now_selects_more_is_resent_what_it_now_selects(commands, monkeypatch):
    _, for_loaded = commands
    read = events_read_through(monkeypatch, steps, "live_events")
    before, after = summary_of(IIS), summary_of(IIS, {**IIS, "load": 0.9})
    (hop,) = steps._resend_to_grown_child(7, before, after)
    assert [wire["id"] for wire in hop.events] == [str(for_loaded.pk)]
    # The event the old summary let through already was not read.
    assert read == [str(for_loaded.pk)]


def test_a_growth_no_live_event_depends_on_reads_no_event(commands, monkeypatch):
    read = events_read_through(monkeypatch, steps, "live_events")
    before, after = summary_of(IIS), summary_of(IIS, {**IIS, "region": "Southeast"})
    assert steps._resend_to_grown_child(7, before, after) == []
    assert read == []


def test_a_child_with_no_summary_before_is_resent_everything_it_may_match(commands):
    hops = steps._resend_to_grown_child(7, None, summary_of(IIS))
    assert [wire["id"] for wire in hops[0].events] == [str(commands[0].pk)]


def stored_versions(dispatcher_id: int, *summaries: Summary) -> list[int]:
    """Store these summaries one after the other as the dispatcher's; their versions."""
    return [
        steps._save_summary(dispatcher_id, summary, steps._summary_row(dispatcher_id, lock=True))
        for summary in summaries
    ]


def first_leaf_and_its_parent() -> tuple[int, int]:
    child = Dispatcher.objects.filter(is_leaf=True).order_by("id").first().id
    return child, dispatch_state.topology(child).parent[child]


def test_a_late_refresh_resends_what_its_own_growth_concerns(commands):
    _, for_loaded = commands
    child, parent = first_leaf_and_its_parent()
    loaded = {**IIS, "load": 0.9}
    _, grown, _ = stored_versions(
        child,
        summary_of(IIS),
        summary_of(IIS, loaded),
        summary_of(IIS, loaded, {**IIS, "region": "Southeast"}),
    )
    # The child stored a version since: the parent still knows what this growth added.
    hops = steps.refresh_summary(parent, child, grown)
    (resent,) = [hop for hop in hops if isinstance(hop, RouteHop)]
    assert [wire["id"] for wire in resent.events] == [str(for_loaded.pk)]


def test_a_refresh_for_a_version_no_longer_kept_resends_all_the_child_may_match(commands):
    child, parent = first_leaf_and_its_parent()
    first, *_ = stored_versions(child, *[summary_of({**IIS, "load": n / 100}) for n in range(70)])
    assert steps._grown_summary(child, first)[0] is None
    hops = steps.refresh_summary(parent, child, first)
    (resent,) = [hop for hop in hops if isinstance(hop, RouteHop)]
    assert [wire["id"] for wire in resent.events] == [str(commands[0].pk)]


def test_a_grown_summary_keeps_a_moved_number_as_its_range_and_lists_the_rest(commands):
    kept = summary_of(IIS, {**IIS, "load": 0.5})
    moved = summary_of({**IIS, "load": 0.2}, {**IIS, "load": 0.7, "software": "nginx"})
    stored = moved.with_moved_numbers_as_ranges(kept)
    assert stored.covers(moved) and not kept.covers(moved)
    load = stored.attributes["load"]
    assert (load.values, load.low, load.high) == (None, 0.2, 0.7)
    assert stored.attributes["software"].values == moved.attributes["software"].values
    # The next values within the range are covered: no growth at every report.
    assert stored.covers(summary_of({**IIS, "load": 0.31}, {**IIS, "load": 0.69}))
    assert not stored.covers(summary_of({**IIS, "load": 0.9}))


def test_a_leaf_whose_loads_move_within_their_range_stores_no_new_summary(tree_left_alone):
    scenario = load_scenario(servers=8)
    leaf_id = scenario.servers[0].dispatcher_id
    here = [s for s in scenario.servers if s.dispatcher_id == leaf_id]
    assert len(here) >= 2

    def loads(*values: float) -> int:
        for server, value in zip(here, values, strict=False):
            state_attributes(client=server, values={"load": value}, actor=ISSUER)
        steps.post_hops(steps.apply_client_changes(leaf_id))
        return DispatcherSummary.objects.get(pk=leaf_id).version

    dispatch_state.topology(leaf_id)  # the shape of this test's tree, not an earlier one's
    steps.post_hops(steps.recompute_summaries())
    exact = DispatcherSummary.objects.get(pk=leaf_id).version
    grown = loads(0.05, 0.95)  # beyond the exact listing: grows, once
    assert grown == exact + 1
    assert [loads(0.3 + n / 100, 0.6 - n / 100) for n in range(5)] == [grown] * 5
    assert loads(0.99) == grown + 1  # beyond the range: grows again
    dispatch_state.forget_leaf(leaf_id)
