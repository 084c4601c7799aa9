"""Subtree summaries may over-approximate but never miss (pure Python, no database)."""

import math

from hypothesis import given
from hypothesis import strategies as st

from broker.dispatch.summary import Summary
from policies import parse_policy, parse_selector
from tests.policies.policy_strategies import (
    EVENT_NAMES,
    PROPERTY,
    RECEIVER_NAMES,
    SENDER_NAMES,
    attribute_maps,
    policy_cases,
    selector_cases,
)


def json_safe(attributes: dict) -> dict:
    """Receivers' values as they come out of the database: plain JSON values only."""
    return {
        name: value
        for name, value in attributes.items()
        if isinstance(value, str | bool | int)
        or (isinstance(value, float) and math.isfinite(value))
    }


receivers = st.lists(
    st.tuples(
        attribute_maps(RECEIVER_NAMES).map(json_safe),
        policy_cases(depth=2).map(lambda case: parse_policy(case[0])),
    ),
    min_size=1,
    max_size=6,
)


def round_tripped(summary: Summary) -> Summary:
    return Summary.from_json(summary.to_json())


@PROPERTY
@given(receivers, selector_cases(depth=2))
def test_a_summary_never_rules_out_a_receiver_the_selector_selects(group, case):
    selector = parse_selector(case[0])
    summary = round_tripped(Summary.of_receivers(group))
    if any(selector.selects(attributes) for attributes, _ in group):
        assert summary.may_select(selector)


@PROPERTY
@given(
    receivers,
    attribute_maps(SENDER_NAMES).map(json_safe),
    attribute_maps(EVENT_NAMES).map(json_safe),
)
def test_a_summary_never_rules_out_a_sender_some_policy_accepts(group, sender, event):
    summary = round_tripped(Summary.of_receivers(group))
    if any(policy.accepts(sender, event) for _, policy in group):
        assert summary.may_accept(sender, event)


@PROPERTY
@given(receivers, receivers, selector_cases(depth=2))
def test_a_union_lets_through_what_either_part_lets_through(left, right, case):
    selector = parse_selector(case[0])
    parts = [Summary.of_receivers(left), Summary.of_receivers(right)]
    union = round_tripped(Summary.union(parts))
    assert union.covers(parts[0]) and union.covers(parts[1])
    if any(part.may_select(selector) for part in parts):
        assert union.may_select(selector)


@PROPERTY
@given(receivers, receivers, selector_cases(depth=2))
def test_covering_means_letting_through_everything_the_other_does(left, right, case):
    selector = parse_selector(case[0])
    a, b = Summary.of_receivers(left), Summary.of_receivers(right)
    if a.covers(b) and b.may_select(selector):
        assert a.may_select(selector)


def test_an_empty_subtree_matches_nothing():
    assert not Summary().may_select(None)
    assert not Summary().may_accept({"trust": 3}, {"kind": "command"})
