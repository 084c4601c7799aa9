"""Untrusted input: strict decoding of JSON, shared by the agent socket and the HTTP API;
text that hides characters; the address a request claims to come from.

Python's `json` accepts more than what we can store or answer: `NaN` and `Infinity`,
numbers too large for any column, strings holding `\\u0000` (PostgreSQL's text and
jsonb cannot hold it) or a lone surrogate (not text in any encoding), and nesting deep
enough to exhaust the interpreter's stack. Each of these is refused here, before any
service sees it, with the path of the offending field as spelled in the frame or body
(`values.hostname`, `content.kind`, `result.lines[2]`).
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
from typing import Any

from django.conf import settings

from broker.errors import BrokerError, InvalidInput

MAX_DEPTH = 32
INT_MIN, INT_MAX = -(2**63), 2**63 - 1

# A JSON string (possessive, so that an unterminated one cannot backtrack), and a bracket.
_STRING = re.compile(r'"[^"\\]*+(?:\\.[^"\\]*+)*+"', re.DOTALL)
_BRACKET = re.compile(r"[\[\]{}]")


class _Refused:
    """What a number the decoder will not accept is decoded as, until its path is known."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


_NON_FINITE = _Refused("must be a finite number (NaN and Infinity are not JSON)")
_OUT_OF_RANGE = _Refused(f"must be a whole number from {INT_MIN} to {INT_MAX}")


def decode_json(text: str, *, whole: str, malformed: type[BrokerError] = InvalidInput) -> Any:
    """The JSON value of `text`, or a BrokerError naming what is wrong and where.

    `whole` names the document itself (`frame`, `body`); text that is not JSON, or
    nested deeper than MAX_DEPTH, is refused as `malformed` naming it. A bad value is
    refused as InvalidInput naming its path.
    """
    # Counting the openings is done in C: a frame with few cannot nest too deep, and
    # most frames are spared the scan.
    openings = text.count("[") + text.count("{")
    if openings > MAX_DEPTH and nesting_depth(text) > MAX_DEPTH:
        raise malformed(f"JSON nested deeper than {MAX_DEPTH} levels", field=whole)
    try:
        value = json.loads(text, parse_constant=_non_finite, parse_float=_float, parse_int=_int)
    except ValueError as error:
        raise malformed(f"not JSON: {error}", field=whole) from None
    check_decoded(value, "")
    return value


def nesting_depth(text: str) -> int:
    """How deeply the arrays and objects of JSON `text` nest, found without recursion
    and stopping as soon as it exceeds MAX_DEPTH (brackets inside strings do not count)."""
    depth = deepest = 0
    for bracket in _BRACKET.findall(_STRING.sub("", text)):
        depth += 1 if bracket in "[{" else -1
        deepest = max(deepest, depth)
        if deepest > MAX_DEPTH:
            break
    return deepest


def _non_finite(_constant: str) -> _Refused:
    return _NON_FINITE


def _float(literal: str) -> float | _Refused:
    number = float(literal)
    return number if math.isfinite(number) else _NON_FINITE


def _int(literal: str) -> int | _Refused:
    # Checked on the digits first: converting a very long literal is slow (and refused).
    if len(literal.lstrip("-")) > 19:
        return _OUT_OF_RANGE
    number = int(literal)
    return number if INT_MIN <= number <= INT_MAX else _OUT_OF_RANGE


def check_decoded(value: Any, path: str) -> None:
    """Refuse, naming its path, any part of a decoded value that cannot be stored."""
    if isinstance(value, str):
        check_text(value, path)
    elif isinstance(value, _Refused):
        raise InvalidInput(f"{path or 'the value'} {value.reason}", field=path or None)
    elif isinstance(value, dict):
        for key, item in value.items():
            check_text(key, _joined(path, printable_text(key)))
            check_decoded(item, _joined(path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            check_decoded(item, f"{path}[{index}]")


def check_text(text: str, path: str) -> None:
    """Refuse text holding NUL or a lone surrogate, naming `path`."""
    if "\x00" in text:
        raise InvalidInput(f"{path or 'the text'} may not contain \\u0000", field=path or None)
    if not is_unicode(text):
        raise InvalidInput(
            f"{path or 'the text'} holds a lone surrogate, which is not text", field=path or None
        )


def is_unicode(text: str) -> bool:
    """Whether `text` is valid Unicode (no lone surrogates), so it can be encoded."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def printable_text(text: str, limit: int | None = None) -> str:
    """`text` as any UTF-8 reader and PostgreSQL accept it: NUL and lone surrogates
    spelled out as JSON escapes, cut to `limit` characters."""
    if "\x00" in text or not is_unicode(text):
        text = text.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\u0000")
    return text if limit is None or len(text) <= limit else text[: limit - 1] + "…"


def _joined(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


# Characters that show nothing, or change how the text around them reads, so that what
# an operator sees could differ from what a receiver acts on: controls (but tab and
# line breaks), Unicode's format characters (bidirectional overrides and isolates,
# zero-width spaces and joiners, the byte-order mark, tags...), the line and paragraph
# separators, and blanks that are letters (Hangul fillers, the grapheme joiner, the
# blank braille pattern). tests/broker/test_inputs.py checks the list against Python's
# Unicode tables.
INVISIBLE = re.compile(
    "[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u00ad\u034f\u0600-\u0605\u061c\u06dd\u070f"
    "\u0890\u0891\u08e2\u115f\u1160\u17b4\u17b5\u180e\u200b-\u200f\u2028-\u202e"
    "\u2060-\u2064\u2066-\u206f\u2800\u3164\ufeff\uffa0\ufff9-\ufffb\U000110bd\U000110cd"
    "\U00013430-\U0001343f\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0001"
    "\U000e0020-\U000e007f]"
)


def reveal_invisible(text: str) -> str:
    """`text` with each invisible character spelled out visibly, as ⟨U+202E⟩."""
    return INVISIBLE.sub(lambda found: f"⟨U+{ord(found[0]):04X}⟩", text)


def invisible_characters(text: str) -> list[str]:
    """The invisible characters `text` holds, each once, as "U+202E RIGHT-TO-LEFT
    OVERRIDE", in order of code point."""
    found = sorted(set(INVISIBLE.findall(text)))
    return [f"U+{ord(c):04X} {unicodedata.name(c, 'control character')}" for c in found]


def invisible_in(value: Any, path: str) -> list[tuple[str, list[str]]]:
    """Where in `value` (text, or JSON-like dicts and lists, keys included) invisible
    characters hide: (path, invisible_characters) for each text that holds some."""
    if isinstance(value, str):
        found = invisible_characters(value)
        return [(path, found)] if found else []
    if isinstance(value, dict):
        return [
            hit
            for key, item in value.items()
            for hit in [
                *invisible_in(str(key), f"{path} (a name)"),
                *invisible_in(item, _joined(path, str(key))),
            ]
        ]
    if isinstance(value, list):
        return [
            hit
            for index, item in enumerate(value)
            for hit in invisible_in(item, f"{path}[{index}]")
        ]
    return []


def client_address(request) -> str:
    """The address an HTTP request comes from: the socket's peer, or behind
    TRUSTED_PROXY_COUNT reverse proxies the address the outermost of them saw (each
    proxy appends the address it saw to X-Forwarded-For, so only the last N entries
    were written by proxies we trust; anything before them the client chose)."""
    proxies = settings.TRUSTED_PROXY_COUNT
    forwarded = [a.strip() for a in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",")]
    if proxies and len(forwarded) >= proxies and forwarded[-proxies]:
        return forwarded[-proxies]
    return request.META.get("REMOTE_ADDR", "")
