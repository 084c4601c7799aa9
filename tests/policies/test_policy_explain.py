"""Explaining a policy or a selector clause by clause, with the values tested."""

from policies import parse_policy, parse_selector
from policies.explain import admits_sender, check_policy, check_selector

WEB_SERVER_POLICY = parse_policy(
    'accept (sender.organization == "Intellimune" and event.kind == "command")'
    ' or (event.threat_level >= 4 and sender.region == "Northwest" and sender.trust >= 2)'
)
ALERT = {"alert": "worm", "threat_level": 4}
ROGUE = {"organization": "Government", "region": "Northwest", "trust": 1}


def test_a_refusal_names_each_failing_constraint_with_the_value_tested():
    verdict = check_policy(WEB_SERVER_POLICY, ROGUE, ALERT)

    assert not verdict.holds
    failing = [str(check) for branch in verdict.branches for check in branch.failing]
    assert failing == [
        'event.kind == "command" (event.kind is missing)',
        'sender.organization == "Intellimune" (sender.organization is "Government")',
        "sender.trust >= 2 (sender.trust is 1)",
    ]
    assert "sender.trust >= 2 (sender.trust is 1)" in verdict.reason


def test_an_acceptance_names_the_branch_that_held_and_every_check_of_it():
    trusted = {**ROGUE, "trust": 2}

    verdict = check_policy(WEB_SERVER_POLICY, trusted, ALERT)

    assert verdict.holds and verdict.reason == ""
    assert verdict.clause == (
        'event.threat_level >= 4 and sender.region == "Northwest" and sender.trust >= 2'
    )
    held = next(branch for branch in verdict.branches if branch.holds)
    assert [(c.attribute, c.value_text) for c in held.checks] == [
        ("event.threat_level", "4"),
        ("sender.region", '"Northwest"'),
        ("sender.trust", "2"),
    ]


def test_a_selector_is_checked_against_the_receivers_attributes():
    selector = parse_selector('software == "IIS" and load >= 0.8')

    verdict = check_selector(selector, {"software": "IIS", "load": 0.35})

    assert not verdict.holds
    assert [str(c) for c in verdict.branches[0].failing] == ["load >= 0.8 (load is 0.35)"]


def test_no_selector_selects_every_receiver_and_a_false_policy_accepts_nothing():
    assert check_selector(None, {}).holds
    nothing = check_policy(parse_policy("accept false"), {}, {})
    assert not nothing.holds and nothing.reason == "it accepts nothing"


def test_a_sender_is_admitted_when_some_branch_holds_on_its_attributes_alone():
    filters = WEB_SERVER_POLICY.filters()
    trusted = {**ROGUE, "trust": 2}
    assert admits_sender(filters, trusted)  # whatever the content: a low threat too
    assert not check_policy(WEB_SERVER_POLICY, trusted, {"threat_level": 1}).holds
    assert not admits_sender(filters, ROGUE)  # trust 1 fails every branch
    assert not admits_sender(filters, None)
    assert admits_sender(parse_policy('accept event.kind == "command"').filters(), ROGUE)
    assert not admits_sender(parse_policy("accept false").filters(), ROGUE)
