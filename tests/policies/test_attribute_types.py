"""One definition per attribute type: its words, its value check and its literals; and
the typed texts built on it (version ranges, the bool shorthand, unknown names)."""

from __future__ import annotations

import pytest

from policies import (
    AttributeType,
    PolicySyntaxError,
    PolicyTypeError,
    Version,
    parse_policy,
    parse_selector,
)
from policies.types import (
    ATTRIBUTE_TYPE_CHOICES,
    MAX_TEXT_LENGTH,
    TYPE_DEFINITIONS,
    LiteralMismatch,
    ValueMismatch,
    check_value,
    fit_literal,
)

WEB_SERVER = {
    "hostname": "string",
    "software": "string",
    "version": "version",
    "cgi": "bool",
    "load": "float",
    "region": "string",
}
CONTROLLER = {"organization": "string", "scope": "string", "region": "string", "trust": "int"}
EVENT = {"kind": "string", "threat_level": "int", "version": "string"}


def _type_error(parse, text: str, **models) -> PolicyTypeError:
    with pytest.raises(PolicyTypeError) as caught:
        parse(text, **models)
    return caught.value


# The definitions --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("declared", "value", "stored"),
    [
        ("string", "IIS", "IIS"),
        ("int", 4, 4),
        ("float", 1, 1.0),
        ("float", 0.75, 0.75),
        ("bool", False, False),
        ("version", "2.10.1", "2.10.1"),
    ],
)
def test_a_fitting_value_is_returned_in_its_stored_form(declared, value, stored):
    checked = check_value(AttributeType(declared), value)
    assert checked == stored and type(checked) is type(stored)


@pytest.mark.parametrize(
    ("declared", "value"),
    [
        ("string", 4),
        ("int", 2.5),
        ("int", True),
        ("float", "0.8"),
        ("float", float("nan")),
        ("bool", 1),
        ("version", "2.x"),
        ("version", 2.4),
    ],
)
def test_a_value_that_does_not_fit_is_refused_in_the_types_words(declared, value):
    with pytest.raises(ValueMismatch) as refused:
        check_value(AttributeType(declared), value)
    assert str(refused.value).startswith(f"must be {TYPE_DEFINITIONS[declared].words}, got ")


def test_text_longer_than_the_limit_is_refused_whatever_the_type():
    with pytest.raises(ValueMismatch, match=f"longer than {MAX_TEXT_LENGTH} characters"):
        check_value(AttributeType.STRING, "x" * (MAX_TEXT_LENGTH + 1))


@pytest.mark.parametrize("declared", list(AttributeType))
def test_values_and_literals_are_described_by_the_same_words(declared):
    words = TYPE_DEFINITIONS[declared].words
    misfit = True if declared is AttributeType.STRING else "three"
    with pytest.raises(ValueMismatch) as value_error:
        check_value(declared, misfit)
    with pytest.raises(LiteralMismatch) as literal_error:
        fit_literal("==", misfit, declared, "'x'")
    assert words in str(value_error.value) and words in str(literal_error.value)


def test_a_models_type_choices_are_the_defined_types():
    assert [value for value, _ in ATTRIBUTE_TYPE_CHOICES] == [t.value for t in AttributeType]
    assert dict(ATTRIBUTE_TYPE_CHOICES)["float"] == "float: a number"


def test_a_version_literal_becomes_a_version_but_a_glob_stays_text():
    assert fit_literal(">=", "2.4", AttributeType.VERSION, "'version'") == Version("2.4")
    assert fit_literal("~", "2.4.*", AttributeType.VERSION, "'version'") == "2.4.*"


# Version ranges compare numerically once typed -------------------------------------


@pytest.mark.parametrize(
    ("selector", "selected", "passed_over"),
    [
        ('version >= "2.4"', "2.10.1", "2.3.9"),
        ('version < "2.10"', "2.9", "2.10.0"),
        ('version == "2.4.0"', "2.4", "2.4.1"),
        ('version in ["2.4.0", "3"]', "3.0.0", "2.40"),
    ],
)
def test_typed_version_ranges_compare_dotted_numbers(selector, selected, passed_over):
    typed = parse_selector(selector, receiver_model=WEB_SERVER)
    assert typed.selects({"version": selected})
    assert not typed.selects({"version": passed_over})


def test_untyped_version_text_compares_as_text_which_is_why_the_broker_types_it():
    assert not parse_selector('version >= "2.4"').selects({"version": "2.10.1"})


def test_a_version_literal_survives_canonical_text_when_parsed_again_with_the_model():
    first = parse_selector('version >= "2.4"', receiver_model=WEB_SERVER)
    again = parse_selector(first.text(), receiver_model=WEB_SERVER)
    assert again == first and again.selects({"version": "2.10"})


# Ill-typed texts name the position and the expected type ----------------------------


@pytest.mark.parametrize(
    ("text", "position", "words"),
    [
        ('load >= "high"', (1, 9), "expected a number for 'load' (float)"),
        ('cgi == "yes"', (1, 8), "expected true or false for 'cgi' (bool)"),
        ('software == "IIS" and\n  version >= "two"', (2, 14), "a dotted version"),
    ],
)
def test_a_selector_literal_that_does_not_fit_names_its_position_and_type(text, position, words):
    error = _type_error(parse_selector, text, receiver_model=WEB_SERVER)
    assert (error.line, error.column) == position
    assert words in error.reason


def test_a_quoted_number_for_a_number_attribute_says_to_drop_the_quotes():
    error = _type_error(
        parse_policy, 'accept sender.trust >= "2"', sender_model=CONTROLLER, event_model=EVENT
    )
    assert error.reason == (
        "expected a whole number for 'sender.trust' (int), found \"2\": write 2 without quotes"
    )
    assert (error.line, error.column) == (1, 24)


def test_an_unknown_name_lists_the_known_ones_and_suggests_the_closest():
    error = _type_error(parse_selector, "lod > 1", receiver_model=WEB_SERVER)
    assert error.reason.startswith("unknown attribute 'lod': receivers' models declare cgi, ")
    assert error.reason.endswith("did you mean 'load'?")
    assert (error.line, error.column) == (1, 1)


def test_an_undeclared_event_attribute_is_unknown_to_a_policy():
    error = _type_error(
        parse_policy, "accept event.threat_levle >= 4", sender_model=CONTROLLER, event_model=EVENT
    )
    assert "the declared event attributes are kind, threat_level, version" in error.reason
    assert error.reason.endswith("did you mean 'event.threat_level'?")
    nothing = _type_error(parse_policy, "accept event.x == 1", sender_model={}, event_model={})
    assert "no event attribute is declared" in nothing.reason


# The bool shorthand -------------------------------------------------------------------


def test_a_bare_bool_attribute_means_equal_to_true():
    selector = parse_selector(
        'receiver.software == "IIS" and receiver.cgi', receiver_model=WEB_SERVER
    )
    assert selector.text() == 'software == "IIS" and cgi == true'
    assert selector.selects({"software": "IIS", "cgi": True})
    assert not selector.selects({"software": "IIS", "cgi": False})
    assert not selector.selects({"software": "IIS"})


def test_not_before_the_shorthand_also_selects_receivers_without_the_attribute():
    selector = parse_selector("not cgi", receiver_model=WEB_SERVER)
    assert selector.selects({"cgi": False}) and selector.selects({})
    assert not selector.selects({"cgi": True})


def test_the_shorthand_on_an_attribute_that_is_not_bool_is_a_type_error():
    error = _type_error(parse_selector, 'software == "IIS" and load', receiver_model=WEB_SERVER)
    assert error.reason == (
        "'load' alone means 'load == true', which needs true or false, but 'load' is a "
        "float (a number): compare it with a value"
    )
    assert (error.line, error.column) == (1, 23)


def test_the_shorthand_works_in_policies_too():
    policy = parse_policy("accept event.urgent", sender_model={}, event_model={"urgent": "bool"})
    assert policy.accepts({}, {"urgent": True}) and not policy.accepts({}, {"urgent": "yes"})


def test_a_missing_value_names_the_type_the_attribute_expects():
    with pytest.raises(PolicySyntaxError) as caught:
        parse_selector("load >= 0.8 and\n  receiver.cgi ==", receiver_model=WEB_SERVER)
    assert str(caught.value) == (
        "expected true or false for 'receiver.cgi' after '==' at line 2, column 18"
    )
    with pytest.raises(PolicySyntaxError) as caught:
        parse_policy("accept sender.trust >= or", sender_model=CONTROLLER, event_model=EVENT)
    assert caught.value.reason == (
        "expected a whole number for 'sender.trust' after '>=' but found 'or'"
    )


def test_only_text_that_is_a_number_as_written_gets_the_unquoting_hint():
    error = _type_error(parse_selector, 'trust >= "1_000"', receiver_model=CONTROLLER)
    assert error.reason == "expected a whole number for 'trust' (int), found \"1_000\""
