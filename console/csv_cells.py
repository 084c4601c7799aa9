"""Text as the console's CSV downloads write it (the audit log's and the reports')."""

from __future__ import annotations

import csv
import io

from broker.inputs import reveal_invisible

# A spreadsheet runs a cell starting with one of these as a formula (CSV injection).
FORMULA_STARTS = frozenset("=+-@\t\r")


def safe_cell(text: str) -> str:
    """`text` with its invisible characters spelled out (⟨U+202E⟩), as the pages show
    them, and a leading ' if a spreadsheet would otherwise run it as a formula."""
    text = reveal_invisible(text)
    return f"'{text}" if text and text[0] in FORMULA_STARTS else text


def csv_text(rows: list) -> str:
    """`rows` (lists of cells) as CSV text."""
    buffer = io.StringIO()
    csv.writer(buffer).writerows(rows)
    return buffer.getvalue()
