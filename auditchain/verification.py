"""Verifying the audit log: every entry's authentication code is made again from what
the entry holds now, with the console's key (and the keys it had before), and compared
with the code the console made as it wrote the entry.

Whoever edits an entry, or writes one, without the console's key (in psql, in a dump
restored after editing) cannot make a code that holds: the entry is found and named.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterator
from dataclasses import dataclass

from django.conf import settings

from broker.audit import entry_code
from broker.models import AuditEntry

# Entries read at a time (a server-side cursor: a year's log is never held in memory).
BATCH = 5_000

CHANGED = "changed"  # its code does not hold for what it holds now
UNAUTHENTICATED = "unauthenticated"  # it has no code


@dataclass(frozen=True)
class Finding:
    """An entry that the log's evidence does not vouch for, and why."""

    entry_id: int
    problem: str
    message: str


def findings(*, after: int = 0) -> Iterator[Finding]:
    """Every entry (of id above `after`, in id order) whose code does not hold."""
    secrets = [settings.SECRET_KEY, *settings.SECRET_KEY_FALLBACKS]
    entries = AuditEntry.objects.filter(id__gt=after).order_by("id")
    for entry in entries.iterator(chunk_size=BATCH):
        finding = _finding(entry, secrets)
        if finding is not None:
            yield finding


def _finding(entry: AuditEntry, secrets: list[str]) -> Finding | None:
    if not entry.mac:
        return Finding(entry.id, UNAUTHENTICATED, (
            f"entry {entry.id} ({entry.at:%Y-%m-%d %H:%M:%S} {entry.action}) has no "
            "authentication code: written outside the console, or before codes were kept"
        ))  # fmt: skip
    if any(hmac.compare_digest(entry_code(entry, secret=s), entry.mac) for s in secrets):
        return None
    return Finding(entry.id, CHANGED, (
        f"entry {entry.id} ({entry.at:%Y-%m-%d %H:%M:%S} {entry.action}): its "
        "authentication code does not hold: changed since the console wrote it, or "
        "written outside the console"
    ))  # fmt: skip
