"""The agent's own evaluator of the policy language (sn_agent.expressions) agrees with
the console's (`policies`, read without a vocabulary) on every expression and value."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sn_agent.expressions import ExpressionError, Partly, policy_test, selector_test

from demo.scenario import OVERLOADED, VULNERABLE, WEB_SERVER_POLICY, WORM_ALERT
from policies import PolicySyntaxError, PolicyTypeError, parse_policy, parse_selector
from tests.policies.policy_strategies import ALL_LITERALS, PROPERTY, expression_texts

# What an agent can be sent or state: JSON values.
VALUES = [*ALL_LITERALS, "02.4", "2.4.01", "web-10", "IIS", "2.4.7"]
SENDER_NAMES = ["sender.a", "sender.b"]
EVENT_NAMES = ["event.c", "event.d"]
RECEIVER_NAMES = ["a", "receiver.b"]


def attribute_sets(names: list[str]):
    bare = [name.split(".")[-1] for name in names]
    return st.dictionaries(st.sampled_from(bare), st.sampled_from(VALUES), max_size=len(bare))


@PROPERTY
@given(
    text=expression_texts(SENDER_NAMES + EVENT_NAMES, None),
    sender=attribute_sets(SENDER_NAMES),
    event=attribute_sets(EVENT_NAMES),
)
def test_a_policy_accepts_exactly_what_the_console_accepts(text, sender, event):
    policy = f"accept {text}"
    expected = parse_policy(policy).accepts(sender, event)

    assert policy_test(policy)({"sender": sender, "event": event}) is expected


@PROPERTY
@given(text=expression_texts(RECEIVER_NAMES, None), receiver=attribute_sets(RECEIVER_NAMES))
def test_a_selector_selects_exactly_what_the_console_selects(text, receiver):
    expected = parse_selector(text).selects(receiver)

    assert selector_test(text)({"receiver": receiver}) is expected


def test_the_scenarios_policy_and_selectors_read_the_same():
    national = {"organization": "Intellimune", "scope": "national", "trust": 3}
    northwest = {"region": "Northwest", "trust": 2}
    for sender, content in [(national, {"kind": "command"}), (northwest, WORM_ALERT)]:
        expected = parse_policy(WEB_SERVER_POLICY).accepts(sender, content)
        assert policy_test(WEB_SERVER_POLICY)({"sender": sender, "event": content}) is expected
        assert expected
    server = {"software": "IIS", "version": "2.4.7", "cgi": True, "load": 0.9}
    for selector in (VULNERABLE, OVERLOADED):
        assert selector_test(selector)({"receiver": server}) is True


@pytest.mark.parametrize(
    "text",
    [
        "accept",
        "accept region == 1",
        "accept sender.a ==",
        "accept (sender.a == 1",
        "accept sender.a == 1 sender.b == 2",
        "accept sender.a ~ 3",
        "accept sender.a < true",
        "accept receiver.a == 1",
        'accept sender.a == "unterminated',
        "accept sender.a == 1 @",
        "sender.a == 1",
    ],
)
def test_what_the_console_refuses_to_parse_the_agent_refuses_too(text):
    with pytest.raises((PolicySyntaxError, PolicyTypeError)):
        parse_policy(text)
    with pytest.raises(ExpressionError):
        policy_test(text)


def test_an_attribute_the_agent_does_not_know_leaves_a_selector_undecided_not_false():
    # An agent states its software; authorities attest its region, which it never sees.
    known = Partly({"software": "IIS"})
    test = selector_test

    assert test('software == "IIS" and region == "Northwest"')({"receiver": known}) is None
    assert test('software == "nginx" and region == "Northwest"')({"receiver": known}) is False
    assert test('software == "IIS" or region == "Northwest"')({"receiver": known}) is True
    assert test("not (region exists)")({"receiver": known}) is None


def test_an_agent_that_states_nothing_of_itself_leaves_every_selector_undecided():
    # The docs' smallest configuration, with [trust]: no [attributes], no providers.
    nothing = Partly({})

    assert selector_test('hostname == "web-00031"')({"receiver": nothing}) is None
    assert selector_test("not (cgi exists)")({"receiver": nothing}) is None
