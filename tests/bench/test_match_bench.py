"""The matching benchmark's brute force (bench/match.py) is a plain loop over compiled
constraints that decides exactly what the policies decide, and the workload table
asserts it finds the Matcher's receivers."""

from __future__ import annotations

from bench.match import (
    brute_force_subscribers,
    compile_rule,
    holds,
    make_workload,
    read_workload,
    run_workloads,
)
from policies import parse_policy, parse_selector

CONTENTS = [{}, {"a": 1}, {"a": 5, "b": "x"}, {"a": 1.0, "b": None}, {"a": True}, {"b": 3}]


def test_compiled_policies_accept_exactly_what_the_policies_accept():
    texts = [
        "accept event.a == 1 and event.b exists",
        "accept not event.a == 1 or event.b not exists",
        "accept event.a != 1",
        'accept event.a >= 1 and not event.b in ["x", "y"]',
        "accept true",
        "accept false",
    ]
    for text in texts:
        policy, compiled = parse_policy(text), compile_rule(parse_policy(text))
        for content in CONTENTS:
            scopes = {"sender": {}, "event": content}
            assert holds(compiled, scopes) == policy.accepts({}, content), (text, content)


def test_compiled_selectors_select_exactly_what_the_selectors_select():
    selector = parse_selector('region in ["north", "west"] and not load >= 0.5')
    compiled = compile_rule(selector)
    for receiver in [{}, {"region": "north"}, {"region": "west", "load": 0.7}, {"load": 0.1}]:
        assert holds(compiled, {"receiver": receiver}) == selector.selects(receiver)


def test_workload_table_checks_the_matcher_against_the_brute_force(tmp_path, capsys):
    path = tmp_path / "tiny.jsonl"
    make_workload(path, subs=200, events=40, seed=3)
    subscriptions, events = read_workload(path)
    compiled = [(sub_id, compile_rule(policy)) for sub_id, policy in subscriptions]
    expected = sum(len(brute_force_subscribers(compiled, {}, event)) for event in events)

    (row,) = run_workloads([(None, path)])

    assert row["matches"] == expected
    assert row["brute_events"] == 40
    assert "tiny.jsonl" in capsys.readouterr().out
