"""Subtree summaries may over-approximate but never miss (pure Python, no database)."""

import math

from hypothesis import given
from hypothesis import strategies as st

from broker.dispatch.summary import Summary
from broker.vocabulary import Vocabulary
from policies import parse_selector
from tests.policies.policy_strategies import (
    EVENT_NAMES,
    PROPERTY,
    RECEIVER_NAMES,
    SENDER_NAMES,
    attribute_maps,
    expression_texts,
    models,
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


@st.composite
def worlds(draw, groups: int = 1) -> tuple[Vocabulary, list]:
    """A vocabulary (one type per name, as the service has) and `groups` groups of
    receivers whose policies it types, so that version literals are versions."""
    sender, event = draw(models(SENDER_NAMES)), draw(models(EVENT_NAMES))
    words = Vocabulary(receiver={}, sender=sender, event=event)
    scoped = [f"sender.{n}" for n in SENDER_NAMES] + [f"event.{n}" for n in EVENT_NAMES]
    policies = expression_texts(scoped, {**sender, **event}, depth=2).map(
        lambda text: words.policy(f"accept {text}")
    )
    receiver = st.tuples(attribute_maps(RECEIVER_NAMES).map(json_safe), policies)
    return words, [draw(st.lists(receiver, min_size=1, max_size=6)) for _ in range(groups)]


def round_tripped(summary: Summary, words: Vocabulary) -> Summary:
    return Summary.from_json(summary.to_json(), words)


@PROPERTY
@given(worlds(), selector_cases(depth=2))
def test_a_summary_never_rules_out_a_receiver_the_selector_selects(world, case):
    words, (group,) = world
    selector = parse_selector(case[0])
    summary = round_tripped(Summary.of_receivers(group), words)
    if any(selector.selects(attributes) for attributes, _ in group):
        assert summary.may_select(selector)


@PROPERTY
@given(
    worlds(),
    attribute_maps(SENDER_NAMES).map(json_safe),
    attribute_maps(EVENT_NAMES).map(json_safe),
)
def test_a_summary_never_rules_out_a_sender_some_policy_accepts(world, sender, event):
    words, (group,) = world
    summary = round_tripped(Summary.of_receivers(group), words)
    if any(policy.accepts(sender, event) for _, policy in group):
        assert summary.may_accept(sender, event)


@PROPERTY
@given(worlds(groups=2), selector_cases(depth=2))
def test_a_union_lets_through_what_either_part_lets_through(world, case):
    words, (left, right) = world
    selector = parse_selector(case[0])
    parts = [Summary.of_receivers(left), Summary.of_receivers(right)]
    union = round_tripped(Summary.union(parts), words)
    assert union.covers(parts[0]) and union.covers(parts[1])
    if any(part.may_select(selector) for part in parts):
        assert union.may_select(selector)


@PROPERTY
@given(worlds(groups=2), selector_cases(depth=2))
def test_covering_means_letting_through_everything_the_other_does(world, case):
    _, (left, right) = world
    selector = parse_selector(case[0])
    a, b = Summary.of_receivers(left), Summary.of_receivers(right)
    if a.covers(b) and b.may_select(selector):
        assert a.may_select(selector)


@PROPERTY
@given(worlds(groups=2), selector_cases(depth=2))
def test_a_summary_grown_with_moved_numbers_as_ranges_lets_through_all_it_grew_to(world, case):
    words, (kept_receivers, grown_receivers) = world
    selector = parse_selector(case[0])
    kept, grown = Summary.of_receivers(kept_receivers), Summary.of_receivers(grown_receivers)
    stored = round_tripped(grown.with_moved_numbers_as_ranges(kept), words)
    assert stored.covers(grown)
    if any(selector.selects(attributes) for attributes, _ in grown_receivers):
        assert stored.may_select(selector)


@PROPERTY
@given(
    worlds(groups=2),
    attribute_maps(SENDER_NAMES).map(json_safe),
    attribute_maps(EVENT_NAMES).map(json_safe),
)
def test_accepting_all_of_another_means_letting_through_every_sender_it_does(world, sender, event):
    _, (left, right) = world
    a, b = Summary.of_receivers(left), Summary.of_receivers(right)
    if a.accepts_all_of(b) and b.may_accept(sender, event):
        assert a.may_accept(sender, event)
    assert Summary.union([a, b]).accepts_all_of(a)


def test_a_version_literal_survives_the_json_form_and_covering():
    words = Vocabulary(receiver={}, sender={}, event={"version": "version"})
    from_24 = Summary.of_receivers([({}, words.policy('accept event.version >= "2.4"'))])
    from_210 = Summary.of_receivers([({}, words.policy('accept event.version >= "2.10"'))])
    stored_24, stored_210 = (round_tripped(s, words) for s in (from_24, from_210))
    assert stored_24.may_accept({}, {"version": "2.10.1"})
    assert not stored_24.may_accept({}, {"version": "2.3.9"})
    assert stored_24.covers(stored_210) and not stored_210.covers(stored_24)


def test_a_stored_summary_that_no_longer_type_checks_lets_everything_through():
    typed = Vocabulary(receiver={}, sender={}, event={"level": "int"})
    stored = Summary.of_receivers([({}, typed.policy("accept event.level >= 4"))]).to_json()
    renamed = Vocabulary(receiver={}, sender={}, event={"severity": "int"})
    assert Summary.from_json(stored, renamed).may_accept({}, {"anything": 1})


def test_an_empty_subtree_matches_nothing():
    assert not Summary().may_select(None)
    assert not Summary().may_accept({"trust": 3}, {"kind": "command"})


def test_figures_count_the_policy_and_measure_no_loss_when_nothing_was_coagulated():
    words = Vocabulary(receiver={}, sender={}, event={"level": "int", "kind": "string"})
    policy = words.policy('accept (event.level >= 4 and event.kind == "alert") or event.level > 8')
    sampled = []
    figures = Summary.of_receivers([({}, policy)]).figures(lambda: sampled.append(1) or [])
    assert figures == {
        "filters": 2, "constraints": 3, "exact_filters": 2, "loss_sampled": 0, "loss_extra": 0,
    }  # fmt: skip
    assert sampled == []  # nothing lost: no sample was read


def test_figures_measure_what_coagulated_filters_accept_beyond_the_exact_ones():
    words = Vocabulary(receiver={}, sender={}, event={"level": "int", "kind": "string"})
    exact = [f'(event.kind == "k{n}" and event.level == {n})' for n in range(40)]
    summary = Summary.of_receivers([({}, words.policy(f"accept {' or '.join(exact)}"))])
    sample = [{"event": {"kind": f"k{a}", "level": b}} for a in range(40) for b in range(40)]
    figures = summary.figures(lambda: sample)
    extra = sum(
        any(f.matches(s) for f in summary.policy_filters)
        and s["event"]["level"] != int(s["event"]["kind"][1:])
        for s in sample
    )
    assert (figures["filters"], figures["exact_filters"]) == (32, 40)
    assert figures["loss_sampled"] == 1600 and figures["loss_extra"] == extra > 0
