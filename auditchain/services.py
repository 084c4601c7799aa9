"""Linking audit entries into the chain, as a periodic task does (auditchain.tasks).

One linker at a time (a transaction lock). Each pass links the entries of the
transactions that ended since the last one, in the order of their transaction ids:
below PostgreSQL's snapshot xmin every transaction has ended, so nothing can still
appear there (broker.reads.clients.snapshot_xmin). An entry already linked is skipped
(an edit gives it a new transaction id: verification finds the edit by its code).
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import connection, transaction
from django.utils import timezone
from sn_agent import signatures

from auditchain import keys
from auditchain.models import AuditLink, ChainHead, Checkpoint
from auditchain.verification import Finding, Since, findings
from broker.audit import chain_code, start_code
from broker.models import AuditEntry
from broker.prepared import int_array, text_array
from broker.reads.clients import snapshot_xmin

LINKER_LOCK = (7_102, 1)  # pg_advisory_xact_lock namespace and key
BATCH = 20_000  # entries linked a pass at most (a first pass over a long log goes on)

UNLINKED = f"""
SELECT e.id, e.mac, e.txid FROM {AuditEntry._meta.db_table} e
WHERE e.txid >= %s AND e.txid < %s
  AND NOT EXISTS (SELECT FROM {AuditLink._meta.db_table} l WHERE l.entry_id = e.id)
ORDER BY e.txid, e.id
LIMIT %s
"""
LINK = f"""
INSERT INTO {AuditLink._meta.db_table} (position, entry_id, mac, chain, linked_at)
SELECT * FROM unnest(%s::bigint[], %s::bigint[], %s::text[], %s::text[], %s::timestamptz[])
"""


@dataclass(frozen=True)
class Linked:
    """What a pass linked: how many entries, and the chain's length after it."""

    entries: int
    position: int


def link_entries(*, batch: int = BATCH) -> Linked:
    """Link the entries written since the last pass (at most `batch`)."""
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", LINKER_LOCK)
        head = ChainHead.objects.select_for_update().first() or ChainHead.objects.create()
        xmin = snapshot_xmin()
        with connection.cursor() as cursor:
            cursor.execute(UNLINKED, [head.horizon, xmin, batch])
            rows = cursor.fetchall()
        _link(head, rows)
        # A full batch may have left entries of its last transaction: start there again.
        head.horizon = rows[-1][2] if len(rows) == batch else xmin
        head.save()
    return Linked(len(rows), head.position)


def _link(head: ChainHead, rows: list[tuple[int, str, int]]) -> None:
    if not rows:
        return
    now = timezone.now()
    positions, chains = [], []
    for entry_id, mac, _ in rows:
        head.position += 1
        head.chain = chain_code(head.chain, entry_id, mac)
        positions.append(head.position)
        chains.append(head.chain)
    ids, macs = [row[0] for row in rows], [row[1] for row in rows]
    with connection.cursor() as cursor:
        cursor.execute(LINK, [int_array(positions), int_array(ids), text_array(macs),
                              text_array(chains), [now] * len(rows)])  # fmt: skip
    head.linked_at = now


@dataclass(frozen=True)
class Verification:
    """A verification's outcome: what it covered and what it found (the first
    `listed` findings, and how many in all)."""

    entries: int
    links: int
    found: int
    listed: list[Finding]


def verify_log(*, listed: int = 100) -> Verification:
    """Verify the whole log (auditchain.verification) and record the outcome on the
    chain's head, for the audit page: what `manage.py verify_audit` runs."""
    head = ChainHead.objects.first() or ChainHead()
    progress = Since(head.position, head.chain, head.horizon)
    entries, links = AuditEntry.objects.count(), AuditLink.objects.count()
    found, first = _run(findings(), listed)
    _record(entries, links, found, first, progress=progress, full=True)
    return Verification(entries, links, found, first)


def verify_since_last(*, listed: int = 100) -> Verification:
    """Verify what was linked or written since the last verification (everything, the
    first time), and every checkpoint; add what it finds to what the last one found:
    what the beat runs every AUDIT_VERIFY_S, reading the new entries only. An entry
    changed after it was verified is found by the next full verification."""
    head = ChainHead.objects.first() or ChainHead()
    if head.verified_at is None:
        return verify_log(listed=listed)
    since = Since(head.verified_position, head.verified_chain, head.verified_horizon)
    progress = Since(head.position, head.chain, head.horizon)
    found, first = _run(findings(since), listed)
    links = progress.position
    _record(links, links, found, first, progress=progress, full=False)
    return Verification(links, links, found, first)


def _run(found_by, listed: int) -> tuple[int, list[Finding]]:
    found, first = 0, []
    for finding in found_by:
        found += 1
        if found <= listed:
            first.append(finding)
    return found, first


def _record(
    entries: int, links: int, found: int, first: list[Finding], *, progress: Since, full: bool
) -> None:
    """The outcome on the chain's head: a full verification's replaces the last; one
    since the last adds to it (a log that did not verify goes on not verifying until a
    full verification finds nothing)."""
    with transaction.atomic():
        head = ChainHead.objects.select_for_update().first() or ChainHead.objects.create()
        if not full:
            found += head.findings
            first_finding = head.first_finding or (first[0].message if first else "")
        else:
            first_finding = first[0].message if first else ""
        head.verified_at = timezone.now()
        head.verified_entries, head.verified_links = entries, links
        head.findings, head.first_finding = found, first_finding
        head.verified_position, head.verified_chain = progress.position, progress.chain
        head.verified_horizon = progress.horizon
        head.save()


def sign_checkpoint() -> Checkpoint | None:
    """Sign the chain's head as it is now, if this host holds the audit key (None if
    not: the chain's newest links are then protected by no signature)."""
    key = keys.audit_key()
    if key is None:
        return None
    head = ChainHead.objects.first() or ChainHead()
    checkpoint = Checkpoint(
        position=head.position, chain=head.chain, signed_at=timezone.now(),
        public_key=keys.public_key_text(key),
    )  # fmt: skip
    checkpoint.signature = signatures.sign(key, checkpoint.document())
    checkpoint.save()
    return checkpoint


def trim_through(*, position: int) -> int:
    """Remove the entries linked at or before `position` (retention: their copies are
    in the reports' dataset), with their links and the checkpoints that name them; the
    chain then starts after it, at a start only the console can move. A batch of links
    at a time, each in one transaction that moves the start with it, so that the log
    verifies after every one. Returns how many entries were removed."""
    removed = 0
    while True:
        with transaction.atomic():
            head = ChainHead.objects.select_for_update().first()
            if head is None or head.start_position >= min(position, head.position):
                return removed
            last = min(position, head.position, head.start_position + BATCH)
            chain = AuditLink.objects.get(position=last).chain
            removed += _remove_links(head.start_position, last)
            head.start_position, head.start_chain = last, chain
            head.start_mac = start_code(last, chain)
            head.save(update_fields=["start_position", "start_chain", "start_mac"])


def _remove_links(after: int, through: int) -> int:
    """The entries linked after `after` through `through`, those links, and the
    checkpoints that name them."""
    links = AuditLink.objects.filter(position__gt=after, position__lte=through)
    removed, _ = AuditEntry.objects.filter(id__in=links.values("entry_id")).delete()
    Checkpoint.objects.filter(position__lte=through).delete()
    links.delete()
    return removed
