"""Every example of docs/policy-language.md parses and means what the document says."""

from __future__ import annotations

import json

import pytest

from policies import Matcher, Version, parse_policy, parse_selector

MACROCORP_POLICY = """\
# Macrocorp web servers
accept
    (sender.organization == "Intellimune" and sender.scope == "national"
     and event.kind == "command")
 or (event.alert exists and event.threat_level >= 4
     and sender.region == "Northwest" and sender.trust >= 2)
"""
SENDER_MODEL = {"organization": "string", "scope": "string", "region": "string", "trust": "int"}
EVENT_MODEL = {
    "kind": "string",
    "alert": "string",
    "threat_level": "int",
    "target": "string",
    "version": "string",
}
RECEIVER_MODEL = {
    "hostname": "string",
    "software": "string",
    "version": "version",
    "cgi": "bool",
    "load": "float",
    "region": "string",
    "organization": "string",
}
CGI_SELECTOR = 'software == "IIS" and version ~ "2.4.*" and cgi == true'
LOAD_SELECTOR = 'software == "IIS" and version ~ "2.4.*" and load >= 0.8'
INTELLIMUNE = {"organization": "Intellimune", "scope": "national", "region": "East", "trust": 3}
NORTHWEST = {"organization": "Gov", "scope": "regional", "region": "Northwest", "trust": 2}
WORM_ALERT = {
    "kind": "alert",
    "alert": "worm",
    "threat_level": 4,
    "target": "IIS",
    "version": "2.4.*",
}


@pytest.fixture(params=[False, True], ids=["untyped", "typed"])
def macrocorp(request):
    if request.param:
        return parse_policy(MACROCORP_POLICY, sender_model=SENDER_MODEL, event_model=EVENT_MODEL)
    return parse_policy(MACROCORP_POLICY)


def test_macrocorp_policy_accepts_an_intellimune_national_command(macrocorp):
    assert macrocorp.accepts(INTELLIMUNE, {"kind": "command", "action": "disable-cgi"})


def test_macrocorp_policy_accepts_a_northwest_trust_2_threat_4_alert(macrocorp):
    assert macrocorp.accepts(NORTHWEST, WORM_ALERT)


def test_macrocorp_policy_refuses_a_trust_1_controller(macrocorp):
    assert not macrocorp.accepts({**NORTHWEST, "trust": 1}, WORM_ALERT)


def test_macrocorp_policy_refuses_low_threat_alerts_and_other_regions(macrocorp):
    assert not macrocorp.accepts(NORTHWEST, {**WORM_ALERT, "threat_level": 3})
    assert not macrocorp.accepts({**NORTHWEST, "region": "Southeast"}, WORM_ALERT)


def test_macrocorp_policy_refuses_regional_intellimune_commands(macrocorp):
    assert not macrocorp.accepts({**INTELLIMUNE, "scope": "regional"}, {"kind": "command"})


def test_macrocorp_policy_ignores_attributes_forged_inside_the_event(macrocorp):
    # Sender attributes come from the attested sender, never from the content.
    forged = {**WORM_ALERT, "region": "Northwest", "trust": 5}
    assert not macrocorp.accepts({**NORTHWEST, "trust": 1}, forged)


def test_macrocorp_policy_comment_is_ignored_and_canonical_text_is_clean(macrocorp):
    assert "#" not in macrocorp.text()
    assert macrocorp.text().startswith("accept sender.organization == ")
    assert len(macrocorp.filters()) == 2


@pytest.mark.parametrize("typed", [False, True])
def test_cgi_selector_selects_iis_2_4_servers_with_cgi(typed):
    selector = parse_selector(CGI_SELECTOR, receiver_model=RECEIVER_MODEL if typed else None)
    server = {"software": "IIS", "version": "2.4.1", "cgi": True, "load": 0.2}
    assert selector.selects(server)
    assert not selector.selects({**server, "cgi": False})
    assert not selector.selects({**server, "version": "2.40"})
    assert not selector.selects({**server, "software": "Apache"})


@pytest.mark.parametrize("typed", [False, True])
def test_load_selector_selects_loaded_iis_2_4_servers(typed):
    selector = parse_selector(LOAD_SELECTOR, receiver_model=RECEIVER_MODEL if typed else None)
    server = {"software": "IIS", "version": "2.4.7", "cgi": False, "load": 0.8}
    assert selector.selects(server)
    assert not selector.selects({**server, "load": 0.79})
    assert not selector.selects({key: v for key, v in server.items() if key != "load"})


def test_event_example_from_the_document_round_trips_through_json():
    event = json.loads(
        '{"content": {"kind": "alert", "alert": "worm", "threat_level": 4,'
        ' "target": "IIS", "version": "2.4.*"},'
        ' "selector": "region == \\"Northwest\\"", "lifetime_s": 600}'
    )
    selector = parse_selector(event["selector"], receiver_model=RECEIVER_MODEL)
    assert selector.selects({"region": "Northwest"})
    assert not selector.selects({"region": "Southeast"})
    policy = parse_policy(MACROCORP_POLICY)
    assert policy.accepts(NORTHWEST, event["content"])


def test_literals_of_every_type_parse():
    selector = parse_selector(
        'software == "IIS" and trust == 4 and load == 0.75 and cgi == true '
        'and debug == false and version == "2.4"'
    )
    values = {c.name: c.value for f in selector.filters() for c in f.constraints}
    assert values == {
        "software": "IIS",
        "trust": 4,
        "load": 0.75,
        "cgi": True,
        "debug": False,
        "version": "2.4",
    }


def test_every_operator_of_the_document_parses_and_evaluates():
    receiver = {"name": "web-7", "n": 3, "tags": "a,b", "version": "2.4.1"}
    cases = {
        "n == 3": True,
        "n != 3": False,
        "n < 4": True,
        "n <= 3": True,
        "n > 3": False,
        "n >= 3": True,
        'version ~ "2.4.*"': True,
        'name ~ "web-*"': True,
        'name startswith "web"': True,
        'name endswith "-7"': True,
        'tags contains ","': True,
        "n in [1, 2, 3]": True,
        "n exists": True,
        "missing not exists": True,
        "n == 3 and not (n == 4 or n == 5)": True,
        "(n == 4 or n == 3) and name exists": True,
    }
    for text, expected in cases.items():
        assert parse_selector(text).selects(receiver) is expected, text


def test_version_comparison_is_numeric_per_component():
    selector = parse_selector('version > "2.4"', receiver_model={"version": "version"})
    assert selector.selects({"version": "2.10"})
    assert not selector.selects({"version": "2.4.0"})
    assert not selector.selects({"version": "2.3.99"})
    assert Version("2.10") > Version("2.4")
    assert Version("2.4") == Version("2.4.0")


def test_scenario_matcher_delivers_alert_to_northwest_servers_only():
    matcher = Matcher()
    policy = parse_policy(MACROCORP_POLICY)
    matcher.add("nw-1", {"software": "IIS", "version": "2.4.1", "region": "Northwest"}, policy)
    matcher.add("nw-2", {"software": "Apache", "version": "2.2", "region": "Northwest"}, policy)
    matcher.add("se-1", {"software": "IIS", "version": "2.4.1", "region": "Southeast"}, policy)
    strict = parse_policy('accept sender.organization == "Intellimune"')
    matcher.add("nw-strict", {"software": "IIS", "region": "Northwest"}, strict)
    selector = parse_selector('region == "Northwest"')
    assert matcher.match(NORTHWEST, WORM_ALERT, selector) == {"nw-1", "nw-2"}
    assert matcher.match({**NORTHWEST, "trust": 1}, WORM_ALERT, selector) == set()
