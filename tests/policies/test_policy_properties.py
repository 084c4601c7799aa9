"""Property-based tests of the policy language (500 examples each in CI)."""

from __future__ import annotations

from unittest import mock

import pytest
from hypothesis import given
from hypothesis import strategies as st
from policy_strategies import (
    EVENT_NAMES,
    PROPERTY,
    RECEIVER_NAMES,
    SENDER_NAMES,
    attribute_maps,
    filter_pairs,
    filters,
    inputs_near,
    policy_cases,
    selector_cases,
)

from policies import (
    Matcher,
    PolicySyntaxError,
    bitsets,
    coagulate,
    covers,
    covers_all,
    filter_index,
    filters_text,
    matcher,
    parse_policy,
    parse_selector,
    receiver_index,
)


@PROPERTY
@given(
    case=policy_cases(),
    senders=st.lists(attribute_maps(SENDER_NAMES), min_size=1, max_size=4),
    events=st.lists(attribute_maps(EVENT_NAMES), min_size=1, max_size=4),
)
def test_policy_filters_accept_exactly_what_the_expression_accepts(case, senders, events):
    text, sender_model, event_model = case
    policy = parse_policy(text, sender_model=sender_model, event_model=event_model)
    for sender in senders:
        for event in events:
            by_filters = any(f.accepts(sender, event) for f in policy.filters())
            assert policy.accepts(sender, event) == by_filters


@PROPERTY
@given(case=selector_cases(), receivers=st.lists(attribute_maps(RECEIVER_NAMES), max_size=6))
def test_selector_filters_select_exactly_what_the_expression_selects(case, receivers):
    text, model = case
    selector = parse_selector(text, receiver_model=model)
    for receiver in receivers:
        assert selector.selects(receiver) == any(f.selects(receiver) for f in selector.filters())


@PROPERTY
@given(case=policy_cases())
def test_canonical_policy_text_parses_back_to_an_equal_expression(case):
    text, sender_model, event_model = case
    policy = parse_policy(text, sender_model=sender_model, event_model=event_model)
    again = parse_policy(policy.text(), sender_model=sender_model, event_model=event_model)
    assert again == policy
    assert again.text() == policy.text()
    from_filters = parse_policy(
        "accept " + filters_text(policy.filters()),
        sender_model=sender_model,
        event_model=event_model,
    )
    assert from_filters.filters() == policy.filters()


@PROPERTY
@given(case=selector_cases())
def test_canonical_selector_text_parses_back_to_an_equal_expression(case):
    text, model = case
    selector = parse_selector(text, receiver_model=model)
    assert parse_selector(selector.text(), receiver_model=model) == selector
    from_filters = parse_selector(filters_text(selector.filters()), receiver_model=model)
    assert from_filters.filters() == selector.filters()


@PROPERTY
@given(data=st.data(), pair=filter_pairs())
def test_covers_never_claims_coverage_a_counter_example_refutes(data, pair):
    a, b = pair
    if covers(a, b):
        for scopes in data.draw(inputs_near(a, b)):
            assert not b.matches(scopes) or a.matches(scopes), (a.text(), b.text(), scopes)


@PROPERTY
@given(
    originals=st.lists(filters(), min_size=1, max_size=10),
    budget=st.integers(1, 4),
    data=st.data(),
)
def test_coagulated_filters_cover_their_inputs(originals, budget, data):
    summary = coagulate(originals, budget)
    assert len(summary) <= budget
    assert covers_all(summary, originals)
    for scopes in data.draw(inputs_near(*originals)):
        if any(f.matches(scopes) for f in originals):
            assert any(f.matches(scopes) for f in summary)


# ---------------------------------------------------------------------------
# Matcher against brute force, with index thresholds forced low in one variant
# so that the checkpoint, rebuild and bitset-union paths all run on tiny data.

TINY_THRESHOLDS = [
    mock.patch.object(receiver_index, "LOW_CARDINALITY", 1),
    mock.patch.object(receiver_index, "MIN_CHECKPOINT_STEP", 1),
    mock.patch.object(receiver_index, "DIRTY_MINIMUM", 2),
    mock.patch.object(filter_index, "CHECKPOINT_EVERY", 2),
    mock.patch.object(filter_index, "REGION_BUDGET", 0),  # thresholds instead of step tables
    mock.patch.object(matcher, "FEW_RECEIVERS", 0),
    mock.patch.object(matcher, "CACHE_PROBE", 2),  # the acceptance cache rests often
    mock.patch.object(matcher, "CACHE_REST", 1),
    mock.patch.object(matcher, "WALK_PER_GROUP", 0),
]


@st.composite
def fleets(draw):
    policies = [parse_policy("accept true")]
    policies += [_parse_case(draw(policy_cases(depth=2))) for _ in range(2)]
    receivers = draw(st.lists(attribute_maps(RECEIVER_NAMES), min_size=1, max_size=20))
    owners = [draw(st.sampled_from(policies)) for _ in receivers]
    changes = draw(
        st.lists(
            st.tuples(
                st.integers(0, 19),
                attribute_maps(RECEIVER_NAMES),
                st.sampled_from(["update", "merge", "remove", "policy"]),
            ),
            max_size=6,
        )
    )
    return policies, list(zip(receivers, owners, strict=True)), changes


def _parse_case(case):
    text, sender_model, event_model = case
    return parse_policy(text, sender_model=sender_model, event_model=event_model)


def _apply_changes(fleet_matcher, state, changes, policies):
    for index, attributes, kind in changes:
        if index not in state:
            continue
        if kind == "remove":
            fleet_matcher.remove(index)
            del state[index]
        elif kind == "policy":
            new_policy = policies[index % len(policies)]
            fleet_matcher.update(index, policy=new_policy)
            state[index] = (state[index][0], new_policy)
        else:
            merged = kind == "merge"
            fleet_matcher.update(index, attributes, merge=merged)
            new_attributes = {**state[index][0], **attributes} if merged else attributes
            state[index] = (new_attributes, state[index][1])


@pytest.mark.parametrize("tiny", [False, True], ids=["default", "tiny-thresholds"])
@PROPERTY
@given(
    fleet=fleets(),
    sender=attribute_maps(SENDER_NAMES),
    contents=st.lists(attribute_maps(EVENT_NAMES), min_size=1, max_size=3),
    selector_case=st.none() | selector_cases(depth=2),
)
def test_matcher_finds_exactly_the_brute_force_receivers(
    tiny, fleet, sender, contents, selector_case
):
    patches = TINY_THRESHOLDS if tiny else []
    for patch in patches:
        patch.start()
    try:
        _check_matcher(fleet, sender, contents, selector_case)
    finally:
        for patch in patches:
            patch.stop()


def _check_matcher(fleet, sender, contents, selector_case):
    policies, receivers, changes = fleet
    policies = [p for p in policies]
    selector = (
        None
        if selector_case is None
        else parse_selector(selector_case[0], receiver_model=selector_case[1])
    )
    fleet_matcher = Matcher()
    state = {}
    for index, (attributes, policy) in enumerate(receivers):
        fleet_matcher.add(index, attributes, policy)
        state[index] = (attributes, policy)
    for round_number, content in enumerate(contents):
        if round_number == 1:
            _apply_changes(fleet_matcher, state, changes, policies)
        expected = {
            index
            for index, (attributes, policy) in state.items()
            if (selector is None or selector.selects(attributes))
            and policy.accepts(sender, content)
        }
        assert fleet_matcher.match(sender, content, selector) == expected
        for index in list(state)[:3]:
            explanation = fleet_matcher.explain(index, sender, content, selector)
            assert explanation.delivered == (index in expected)


@PROPERTY
@given(
    cases=st.lists(policy_cases(depth=2), min_size=1, max_size=6),
    senders=st.lists(attribute_maps(SENDER_NAMES), min_size=1, max_size=3),
    events=st.lists(attribute_maps(EVENT_NAMES), min_size=1, max_size=3),
    tiny=st.booleans(),
)
def test_filter_index_finds_exactly_the_filters_that_hold(cases, senders, events, tiny):
    all_filters = [f for case in cases for f in _parse_case(case).filters()]
    with (
        mock.patch.object(filter_index, "CHECKPOINT_EVERY", 2 if tiny else 16),
        mock.patch.object(filter_index, "REGION_BUDGET", 0 if tiny else 8 << 20),
    ):
        index = filter_index.FilterIndex(all_filters)
        for sender in senders:
            for event in events:
                scopes = {"sender": sender, "event": event}
                expected = {i for i, f in enumerate(all_filters) if f.matches(scopes)}
                assert set(bitsets.members(index.match(scopes))) == expected


@PROPERTY
@given(
    receivers=st.lists(attribute_maps(RECEIVER_NAMES), min_size=1, max_size=30),
    updates=st.lists(st.tuples(st.integers(0, 29), attribute_maps(RECEIVER_NAMES)), max_size=5),
    selectors=st.lists(selector_cases(depth=2), min_size=1, max_size=4),
    tiny=st.booleans(),
)
def test_selector_index_selects_exactly_what_selectors_select(receivers, updates, selectors, tiny):
    patches = TINY_THRESHOLDS if tiny else []
    for patch in patches:
        patch.start()
    try:
        _check_selection(
            receivers, updates, [parse_selector(t, receiver_model=m) for t, m in selectors]
        )
    finally:
        for patch in patches:
            patch.stop()


def _check_selection(receivers, updates, selectors):
    fleet = Matcher()
    everyone = parse_policy("accept true")
    state = dict(enumerate(receivers))
    for index, attributes in state.items():
        fleet.add(index, attributes, everyone)
    for round_number, selector in enumerate(selectors):
        if round_number == 1:
            for index, attributes in updates:
                if index in state:
                    fleet.update(index, attributes)
                    state[index] = attributes
        expected = {index for index, attributes in state.items() if selector.selects(attributes)}
        assert fleet.match({}, {}, selector) == expected, selector.text()


# ---------------------------------------------------------------------------
# Malformed input


@PROPERTY
@given(
    text=st.text(
        alphabet=st.sampled_from(
            list('accept sender.event.x==!<>~()[],"#\n 1.5e-truefalseandornotinexists\\')
        )
    )
)
def test_random_text_raises_only_policy_syntax_errors_with_a_position(text):
    for parse in (parse_policy, parse_selector):
        try:
            parse(text)
        except PolicySyntaxError as error:
            assert error.line >= 1 and error.column >= 1
            assert str(error).endswith(f"at line {error.line}, column {error.column}")


@PROPERTY
@given(case=policy_cases(), cut=st.integers(min_value=0))
def test_truncated_policies_raise_only_policy_syntax_errors(case, cut):
    text, sender_model, event_model = case
    truncated = text[: cut % (len(text) + 1)]
    try:
        parse_policy(truncated, sender_model=sender_model, event_model=event_model)
    except PolicySyntaxError as error:
        assert error.line >= 1 and error.column >= 1
