"""Covering is sound and complete on common cases; coagulation keeps coverage."""

from __future__ import annotations

import pytest

from policies import (
    Filter,
    coagulate,
    covers,
    covers_all,
    filters_text,
    over_acceptance,
    parse_policy,
    parse_selector,
)


def f(text: str, model: dict | None = None) -> Filter:
    (only,) = parse_selector(text, receiver_model=model).filters()
    return only


@pytest.mark.parametrize(
    ("broad", "narrow"),
    [
        ("x <= 3", "x < 2"),
        ("x < 3", "x == 2"),
        ("x >= 1", "x > 1 and x < 5"),
        ("x > 0 and x < 10", "x >= 1 and x <= 9"),
        ("x in [1, 2]", "x == 1"),
        ('x in ["a", "b", "c"]', 'x in ["a", "c"]'),
        ("x exists", "x == 1"),
        ("x exists", 'x startswith "a"'),
        ('x startswith "ab"', 'x == "abc"'),
        ('x startswith "ab"', 'x startswith "abc"'),
        ('x ~ "2.4.*"', 'x startswith "2.4.1"'),
        ('x contains "eb"', 'x ~ "web-*"'),
        ('x endswith "-1"', 'x == "web-1"'),
        ("x != 3", "x > 5"),
        ("not x == 3", "x > 5"),
        ("not x == 3", "x not exists"),
        ("x not exists", "x not exists and y == 1"),
        ("true", 'x == "anything"'),
        ("x == 1", "x == 1 and x == 2"),  # b never holds
    ],
)
def test_covers_recognises_common_generalisations(broad, narrow):
    assert covers(f(broad), f(narrow))


@pytest.mark.parametrize(
    ("broad", "narrow"),
    [
        ("x < 2", "x <= 2"),
        ("x > 1", "x >= 1"),
        ("x == 1", "x in [1, 2]"),
        ('x startswith "abc"', 'x startswith "ab"'),
        ("x != 3", "not x == 3"),  # missing x: not (x == 3) holds, x != 3 does not
        ("x exists", "not x == 1"),
        ("x == 1", "y == 1"),
        ("x == 1", 'x == "1"'),
        ("x == true", "x == 1"),
    ],
)
def test_covers_refuses_what_is_not_covered(broad, narrow):
    assert not covers(f(broad), f(narrow))


def test_covers_compares_versions_numerically():
    model = {"v": "version"}
    assert covers(f('v >= "2.4"', model), f('v >= "2.10"', model))
    assert not covers(f('v >= "2.10"', model), f('v >= "2.4"', model))
    # "2.4" == "2.4.0" as versions, but a glob sees the text: no claim.
    assert not covers(f('v ~ "2.4"', model), f('v == "2.4"', model))


def test_coagulate_respects_the_budget_and_covers_every_input():
    policy_filters = [
        f('region == "Northwest" and load >= 0.8'),
        f('region == "Northeast" and load >= 0.9'),
        f('region == "Southwest" and load >= 0.5 and cgi == true'),
        f('software == "IIS" and version ~ "2.4.*"'),
        f('software == "IIS" and version ~ "2.4.1*"'),
        f('software == "Apache" and version ~ "2.2.*"'),
    ]
    for budget in (1, 2, 3, 6):
        summary = coagulate(policy_filters, budget)
        assert len(summary) <= budget
        assert covers_all(summary, policy_filters)


def test_coagulate_widens_sets_and_intervals_instead_of_dropping_them():
    merged = coagulate([f('region == "a" and load >= 0.8'), f('region == "b" and load >= 0.5')], 1)
    assert filters_text(merged) == 'load >= 0.5 and region in ["a", "b"]'
    ranged = coagulate([f("n > 1 and n < 3"), f("n >= 5 and n <= 9")], 1)
    assert filters_text(ranged) == "n >= 1 and n <= 9"
    prefixed = coagulate([f('name == "web-17"'), f('name ~ "web-2*"')], 1)
    assert filters_text(prefixed) == 'name startswith "web-"'


def test_coagulate_drops_filters_already_covered():
    assert coagulate([f("x > 1"), f("x > 5"), f("x == 7")], 5) == [f("x > 1")]


def test_over_acceptance_reports_extra_acceptances_on_a_sample():
    original = [f("x == 1"), f("x >= 3 and x <= 4")]
    summary = coagulate(original, 1)
    assert filters_text(summary) == "x >= 1 and x <= 4"
    sample = [{"receiver": {"x": value}} for value in range(5)]
    report = over_acceptance(original, summary, sample)
    assert (report.samples, report.accepted_by_original, report.false_negatives) == (5, 3, 0)
    assert report.accepted_by_coagulated == 4  # 2 is accepted only by the summary
    assert report.rate == pytest.approx(0.2)
    assert "over-acceptance 20.0%" in str(report)


def test_policies_coagulate_through_their_filters():
    policies = [
        parse_policy('accept sender.trust >= 3 and event.kind == "alert"'),
        parse_policy('accept sender.trust >= 2 and event.kind == "command"'),
    ]
    filters = [flt for policy in policies for flt in policy.filters()]
    (summary,) = coagulate(filters, 1)
    assert summary.text() == 'event.kind in ["alert", "command"] and sender.trust >= 2'
