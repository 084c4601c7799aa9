"""Matcher behaviour: registration, updates, shared policies and explanations."""

from __future__ import annotations

import pytest

from policies import Matcher, parse_policy, parse_selector
from policies import matcher as matcher_module
from policies.expressions import Always, Not

ALERTS = parse_policy('accept event.kind == "alert" and sender.trust >= 2')
EVERYTHING = parse_policy("accept true")
NORTHWEST = parse_selector('region == "Northwest"')
TRUSTED = {"trust": 3}
ALERT = {"kind": "alert"}


@pytest.fixture
def fleet() -> Matcher:
    matcher = Matcher()
    matcher.add("a", {"region": "Northwest", "load": 0.9}, ALERTS)
    matcher.add("b", {"region": "Northwest", "load": 0.1}, ALERTS)
    matcher.add("c", {"region": "Southeast", "load": 0.9}, EVERYTHING)
    return matcher


def test_match_requires_both_selector_and_policy(fleet):
    assert fleet.match(TRUSTED, ALERT, NORTHWEST) == {"a", "b"}
    assert fleet.match({"trust": 1}, ALERT, NORTHWEST) == set()
    assert fleet.match({"trust": 1}, ALERT, None) == {"c"}


def test_a_selector_selects_by_the_receivers_attributes(fleet):
    assert fleet.match(TRUSTED, ALERT, parse_selector("load >= 0.5")) == {"a", "c"}


def test_updates_move_receivers_in_and_out_of_the_selection(fleet):
    assert fleet.match(TRUSTED, ALERT, parse_selector("load >= 0.8")) == {"a", "c"}
    fleet.update("b", {"load": 0.95}, merge=True)
    assert fleet.attributes("b") == {"region": "Northwest", "load": 0.95}
    assert fleet.match(TRUSTED, ALERT, parse_selector("load >= 0.8")) == {"a", "b", "c"}
    fleet.update("b", {"load": 0.2})  # replaces: region is gone
    assert fleet.attributes("b") == {"load": 0.2}
    assert fleet.match(TRUSTED, ALERT, NORTHWEST) == {"a"}


def test_policy_updates_and_removal(fleet):
    fleet.update("c", policy="accept false")
    assert fleet.match({"trust": 1}, ALERT) == set()
    fleet.remove("a")
    assert "a" not in fleet and len(fleet) == 2
    assert fleet.match(TRUSTED, ALERT, NORTHWEST) == {"b"}
    with pytest.raises(KeyError):
        fleet.remove("a")
    fleet.add("a", {"region": "Northwest"}, ALERTS)  # a freed slot is reused
    assert fleet.match(TRUSTED, ALERT, NORTHWEST) == {"a", "b"}


def test_adding_an_existing_id_is_refused(fleet):
    with pytest.raises(ValueError, match="already registered"):
        fleet.add("a", {}, ALERTS)


def test_receivers_with_equivalent_policies_share_one_group():
    matcher = Matcher()
    first = parse_policy('accept sender.trust >= 2 and event.kind == "alert"')
    second = parse_policy('accept (event.kind == "alert") and sender.trust >= 2')
    for index in range(10):
        matcher.add(index, {"n": index}, first if index % 2 else second)
    assert len(matcher._groups) == 1
    assert matcher.match(TRUSTED, ALERT, parse_selector("n < 3")) == {0, 1, 2}


def test_wrong_types_and_missing_attributes_never_raise():
    matcher = Matcher()
    matcher.add(1, {"load": "high", "tags": ["x"], "v": float("nan")}, EVERYTHING)
    matcher.add(2, {}, EVERYTHING)
    assert matcher.match({}, {}, parse_selector("load >= 0.8")) == set()
    assert matcher.match({}, {}, parse_selector("not load >= 0.8")) == {1, 2}
    assert matcher.match({}, {}, parse_selector("load != 0.8")) == set()
    assert matcher.match({}, {}, parse_selector("v != 1")) == {1}
    assert matcher.match({}, {}, parse_selector("tags exists")) == {1}


def test_not_equal_is_false_but_not_equals_is_true_on_missing_attributes():
    selector = parse_selector("x != 1")
    negation = parse_selector("not x == 1")
    assert not selector.selects({})
    assert negation.selects({})
    assert negation.expression == Not(parse_selector("x == 1").expression)


def test_true_and_false_expressions():
    assert parse_policy("accept true").expression == Always(True)
    assert parse_policy("accept false").filters() == []
    assert parse_selector("true").filters()[0].text() == "true"


def test_explain_names_the_deciding_clauses(fleet):
    delivered = fleet.explain("a", TRUSTED, ALERT, NORTHWEST)
    assert delivered.delivered
    assert str(delivered) == (
        'a receives the event: the selector matches through (region == "Northwest"); '
        'its policy accepts through (event.kind == "alert" and sender.trust >= 2)'
    )
    refused = fleet.explain("b", {"trust": 1}, ALERT, NORTHWEST)
    assert not refused.delivered
    assert "its policy refuses" in str(refused)
    assert "sender.trust >= 2 (sender.trust is 1)" in str(refused)
    unselected = fleet.explain("c", TRUSTED, ALERT, NORTHWEST)
    assert 'region == "Northwest" (region is "Southeast")' in str(unselected)
    assert "every receiver is a candidate" in str(fleet.explain("c", {}, {}, None))


def test_many_receivers_one_policy_take_the_bitset_path():
    matcher = Matcher()
    for index in range(5000):
        matcher.add(index, {"n": index, "even": index % 2 == 0}, ALERTS)
    matcher.prepare()
    assert matcher.match(TRUSTED, ALERT, parse_selector("n >= 4990 and even == true")) == {
        4990,
        4992,
        4994,
        4996,
        4998,
    }
    assert len(matcher.match(TRUSTED, ALERT, parse_selector("n < 1000"))) == 1000
    assert matcher.match({"trust": 0}, ALERT, parse_selector("n < 1000")) == set()


def test_policies_package_never_imports_django():
    import subprocess
    import sys
    from pathlib import Path

    repository = Path(__file__).resolve().parents[2]
    code = (
        "import sys, policies, policies.matcher, policies.coagulation;"
        "assert not [m for m in sys.modules if m.split('.')[0] == 'django']"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=repository)


def test_an_unused_acceptance_cache_rests_and_results_stay_exact(monkeypatch):
    monkeypatch.setattr(matcher_module, "CACHE_PROBE", 4)
    monkeypatch.setattr(matcher_module, "CACHE_REST", 3)
    fleet = Matcher()
    fleet.add("low", {}, "accept event.level < 5")
    fleet.add("high", {}, "accept event.level >= 5")
    fleet.add("also-high", {}, "accept event.level >= 5")
    for level in range(20):  # every event new: the cache never hits
        expected = {"low"} if level < 5 else {"high", "also-high"}
        assert fleet.match({}, {"level": level}) == expected
    assert fleet.match({}, {"level": 3}) == {"low"}  # repeated, whether cached or not


def test_subscriptions_alone_with_their_policy_and_shared_ones_are_both_found():
    fleet = Matcher()
    fleet.add("alone", {}, "accept event.x == 1")
    fleet.add("first", {}, "accept event.x >= 1")
    fleet.add("second", {}, "accept event.x >= 1")
    assert fleet.match({}, {"x": 1}) == {"alone", "first", "second"}
    fleet.remove("second")  # "first" is now alone with its policy
    assert fleet.match({}, {"x": 2}) == {"first"}
    fleet.add("third", {}, "accept event.x == 1")  # "alone" shares again
    fleet.remove("alone")
    assert fleet.match({}, {"x": 1}) == {"first", "third"}
