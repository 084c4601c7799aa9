"""Strict decoding of untrusted JSON: what is refused, and the field each refusal names."""

from __future__ import annotations

import time

import pytest

from broker.errors import InvalidInput
from broker.inputs import MAX_DEPTH, decode_json, nesting_depth, printable_text
from broker.protocol import FrameError


@pytest.mark.parametrize(
    ("text", "field"),
    [
        (r'{"values": {"hostname": "web\u0000"}}', "values.hostname"),
        (r'{"token": "snt_\ud800"}', "token"),
        (r'{"content": {"ki\u0000nd": "x"}}', r"content.ki\u0000nd"),
        (r'{"content": {"k\udfffind": "x"}}', r"content.k\udfffind"),
        ('{"values": {"load": NaN}}', "values.load"),
        ('{"values": {"load": -Infinity}}', "values.load"),
        ('{"values": {"load": 1e999}}', "values.load"),
        ('{"delivery": 9223372036854775808}', "delivery"),
        ('{"delivery": -9223372036854775809}', "delivery"),
        ('{"after": 1' + "0" * 5000 + "}", "after"),
        (r'{"result": {"lines": ["ok", "x\u0000"]}}', "result.lines[1]"),
    ],
)
def test_a_value_that_cannot_be_stored_is_refused_naming_its_path(text, field):
    with pytest.raises(InvalidInput) as refused:
        decode_json(text, whole="frame")
    assert refused.value.field == field


def test_the_largest_64_bit_integers_and_ordinary_text_are_accepted():
    text = '{"a": 9223372036854775807, "b": -9223372036854775808, "c": "Grüße ✓ 🚀", "d": 0.5}'
    assert decode_json(text, whole="frame") == {
        "a": 2**63 - 1,
        "b": -(2**63),
        "c": "Grüße ✓ 🚀",
        "d": 0.5,
    }


def test_twenty_thousand_levels_of_nesting_are_refused_cheaply_as_malformed():
    text = '{"type": "update", "values": ' + "[" * 20_000 + "]" * 20_000 + "}"
    started = time.perf_counter()
    with pytest.raises(FrameError) as refused:
        decode_json(text, whole="frame", malformed=FrameError)
    assert time.perf_counter() - started < 0.05
    assert refused.value.field == "frame" and "nested deeper" in refused.value.message


def test_nesting_up_to_the_limit_is_accepted_and_brackets_inside_strings_do_not_count():
    assert nesting_depth("[" * MAX_DEPTH + "]" * MAX_DEPTH) == MAX_DEPTH
    decode_json("[" * MAX_DEPTH + "]" * MAX_DEPTH, whole="body")
    assert nesting_depth(r'{"a": "[[[[{{{{\"[[["}') == 1


def test_one_level_beyond_the_limit_is_refused_however_few_the_brackets():
    with pytest.raises(InvalidInput) as refused:
        decode_json("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1), whole="body")
    assert "nested deeper" in refused.value.message


def test_many_brackets_side_by_side_are_not_depth():
    assert decode_json("[" + ", ".join(["[]"] * 100) + "]", whole="body") == [[]] * 100


def test_text_that_is_not_json_is_refused_as_malformed_naming_the_document():
    with pytest.raises(InvalidInput) as refused:
        decode_json('{"type": ', whole="body")
    assert refused.value.field == "body" and refused.value.message.startswith("not JSON")


def test_printable_text_spells_out_nul_and_lone_surrogates_and_cuts():
    assert printable_text("a\x00b\ud800c") == r"a\u0000b\ud800c"
    assert printable_text("x" * 300, 200) == "x" * 199 + "…"
    assert printable_text("plain") == "plain"


def test_every_control_format_and_separator_character_counts_as_invisible():
    import sys
    import unicodedata

    from broker.inputs import INVISIBLE

    kinds = {"Cc", "Cf", "Zl", "Zp"}
    missed = [
        f"U+{code:04X}"
        for code in range(sys.maxunicode + 1)
        if unicodedata.category(chr(code)) in kinds
        and chr(code) not in "\t\n\r"
        and not INVISIBLE.fullmatch(chr(code))
    ]
    assert missed == []
    assert not INVISIBLE.search("tab\tline\nreturn\r, é, 漢字, emoji 🪱")


def test_invisible_characters_are_spelled_out_and_named():
    from broker.inputs import invisible_characters, reveal_invisible

    text = "\u202eevil\u202c and zero\u200bwidth"
    assert reveal_invisible(text) == "⟨U+202E⟩evil⟨U+202C⟩ and zero⟨U+200B⟩width"
    assert invisible_characters(text) == [
        "U+200B ZERO WIDTH SPACE",
        "U+202C POP DIRECTIONAL FORMATTING",
        "U+202E RIGHT-TO-LEFT OVERRIDE",
    ]
    assert invisible_characters("\x07") == ["U+0007 control character"]


def test_invisible_characters_are_found_by_path_in_names_and_values():
    from broker.inputs import invisible_in

    content = {"alert": "\u202eevil", "na\u200bme": ["ok", "x\u2066"], "level": 4}
    assert invisible_in(content, "content") == [
        ("content.alert", ["U+202E RIGHT-TO-LEFT OVERRIDE"]),
        ("content (a name)", ["U+200B ZERO WIDTH SPACE"]),
        ("content.na\u200bme[1]", ["U+2066 LEFT-TO-RIGHT ISOLATE"]),
    ]
    assert invisible_in("plain", "selector") == []
