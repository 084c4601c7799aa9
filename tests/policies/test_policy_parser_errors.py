"""Syntax and type errors name the line, the column and what was expected."""

from __future__ import annotations

import pytest

from policies import PolicySyntaxError, PolicyTypeError, parse_policy, parse_selector

RECEIVER_MODEL = {"load": "float", "cgi": "bool", "version": "version", "trust": "int"}


def _error(parse, text, **models) -> PolicySyntaxError:
    with pytest.raises(PolicySyntaxError) as caught:
        parse(text, **models)
    return caught.value


def test_missing_value_after_operator_names_the_operator_and_position():
    error = _error(parse_policy, "accept event.level >=")
    assert str(error) == "expected a value after '>=' at line 1, column 22"
    assert (error.line, error.column) == (1, 22)


def test_missing_value_on_a_later_line_reports_that_line():
    text = 'accept\n  sender.region == "Northwest"\n  and event.threat_level >= # c\n'
    error = _error(parse_policy, text)
    assert str(error) == "expected a value after '>=' at line 3, column 28"


def test_unexpected_word_is_quoted():
    error = _error(parse_policy, "accept event.x ==\n  and event.y == 1")
    assert str(error) == "expected a value after '==' but found 'and' at line 2, column 3"


def test_policy_must_start_with_accept():
    error = _error(parse_policy, 'event.kind == "command"')
    assert error.reason.startswith("expected 'accept'")
    assert (error.line, error.column) == (1, 1)


def test_accept_alone_asks_for_a_condition():
    error = _error(parse_policy, "accept")
    assert (
        str(error) == "expected an attribute name, 'not' or '(' after 'accept' at line 1, column 7"
    )


def test_unclosed_parenthesis_and_string():
    assert "expected ')'" in str(_error(parse_policy, "accept (event.x == 1"))
    error = _error(parse_selector, 'name == "web')
    assert str(error) == "unterminated text: missing closing '\"' at line 1, column 9"


def test_bare_name_in_a_policy_needs_a_scope():
    error = _error(parse_policy, "accept region == 1")
    assert "write sender.region or event.region" in str(error)
    assert (error.line, error.column) == (1, 8)


def test_sender_names_are_refused_in_selectors():
    error = _error(parse_selector, 'load > 1 and sender.region == "x"')
    assert "a selector can only name receiver attributes" in str(error)
    assert (error.line, error.column) == (1, 14)


def test_literal_not_fitting_the_model_is_a_type_error():
    error = _error(parse_selector, 'load >= "high"', receiver_model=RECEIVER_MODEL)
    assert isinstance(error, PolicyTypeError)
    assert str(error) == (
        "expected a number for 'load' (float), found \"high\" at line 1, column 9"
    )


def test_type_errors_cover_int_bool_and_version_attributes():
    cases = {
        "trust == 2.5": "expected a whole number for 'trust'",
        "cgi == 1": "expected true or false for 'cgi'",
        'version >= "2.x"': "expected a dotted version such as \"2.4.1\" for 'version'",
        'load ~ "0.*"': "'~' applies to text, but 'load' is a float",
        "cgi < true": "cannot compare with true or false",
    }
    for text, expected in cases.items():
        error = _error(parse_selector, text, receiver_model=RECEIVER_MODEL)
        assert isinstance(error, PolicyTypeError)
        assert expected in str(error), text


def test_policy_models_check_sender_and_event_attributes():
    error = _error(
        parse_policy,
        'accept sender.trust >= "high"',
        sender_model={"trust": "int"},
        event_model={},
    )
    assert "expected a whole number for 'sender.trust'" in str(error)
    unknown = _error(parse_policy, "accept event.levle > 1", event_model={"level": "int"})
    assert "unknown attribute 'event.levle'" in str(unknown)


def test_model_types_may_be_python_types():
    selector = parse_selector("load >= 1", receiver_model={"load": float})
    assert selector.filters()[0].sorted_constraints()[0].value == 1.0


def test_huge_numbers_and_bad_escapes_are_syntax_errors():
    assert "too large" in str(_error(parse_selector, "x == 1e999"))
    assert "invalid escape" in str(_error(parse_selector, 'x == "\\q"'))


def test_deep_nesting_is_refused_politely():
    error = _error(parse_selector, "(" * 300 + "x == 1" + ")" * 300)
    assert "nested too deeply" in str(error)


def test_errors_are_value_errors_for_generic_callers():
    assert issubclass(PolicySyntaxError, ValueError)
    assert issubclass(PolicyTypeError, PolicySyntaxError)
