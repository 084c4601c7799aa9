"""Line diffs of policy texts, as the pages show them."""

from __future__ import annotations

import difflib
from dataclasses import dataclass


@dataclass(frozen=True)
class DiffLine:
    """One line of a unified diff: `kind` is add, del, hunk or same."""

    kind: str
    text: str


def policy_diff(old: str, new: str) -> list[DiffLine]:
    """The unified diff from `old` to `new` (difflib), without the file headers."""
    lines = difflib.unified_diff(old.splitlines(), new.splitlines(), lineterm="", n=3)
    return [_classified(line) for line in lines if not line.startswith(("---", "+++"))]


def _classified(line: str) -> DiffLine:
    kinds = {"+": "add", "-": "del", "@": "hunk"}
    return DiffLine(kinds.get(line[:1], "same"), line)
