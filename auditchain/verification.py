"""Verifying the audit log, with the console's key (and the keys it had before):

- every entry's authentication code is made again from what the entry holds now and
  compared with the code the console made as it wrote the entry: whoever edits an entry,
  or writes one, without the key (in psql, in a dump restored after editing) cannot
  make a code that holds;
- the chain (auditchain.models.AuditLink) is walked in order: a link whose entry is
  gone names an entry removed; a link whose code is not the one its predecessor, entry
  and entry's code make names a link changed or one removed before it; an entry older
  than the chain's horizon without a link was written around the console.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from itertools import islice

from django.conf import settings
from django.db import connection
from django.utils import timezone
from sn_agent.signatures import signature_holds

from auditchain.keys import key_made_at, trusted_public_keys
from auditchain.models import AuditLink, ChainHead, Checkpoint
from broker.audit import chain_code, entry_code, start_code
from broker.models import AuditEntry

# Entries read at a time (a server-side cursor: a year's log is never held in memory).
BATCH = 5_000

CHANGED = "changed"  # its code does not hold for what it holds now
UNAUTHENTICATED = "unauthenticated"  # it has no code
REMOVED = "removed"  # its link is there, the entry is not
RELINKED = "relinked"  # its code is not the one it was linked with
BROKEN = "broken"  # a link's code does not follow from the one before it
UNLINKED = "unlinked"  # older than the chain's horizon, and not in the chain
CUT = "cut"  # a signed checkpoint names a link that is gone or different
UNSIGNED = "unsigned"  # a checkpoint whose signature does not hold for a trusted key
STALE = "stale"  # this host signs checkpoints, and the newest is long past


@dataclass(frozen=True)
class Finding:
    """An entry that the log's evidence does not vouch for, and why."""

    entry_id: int
    problem: str
    message: str


@dataclass(frozen=True)
class Since:
    """Where an earlier verification ended: the links through `position` (the chain's
    code there, `chain`) and the entries of transactions before `horizon` were checked."""

    position: int
    chain: str
    horizon: int


def findings(since: Since | None = None) -> Iterator[Finding]:
    """Everything the evidence does not vouch for: entries whose code does not hold (in
    id order), then breaks in the chain (in its order), then entries around it, then the
    checkpoints. With `since`, only what was linked or written after it (and every
    checkpoint): an hourly verification that does not read a year's log again."""
    secrets = _secrets()
    if since is None:
        yield from entry_findings(secrets)
        yield from chain_findings(secrets)
        yield from unlinked_findings()
    else:
        yield from chain_findings(secrets, since=since)
        yield from unlinked_findings(after=since.horizon)
    yield from checkpoint_findings()
    yield from stale_findings()


def _secrets() -> list[str]:
    """The keys codes may have been made with: the console's, then its earlier ones."""
    return [settings.SECRET_KEY, *settings.SECRET_KEY_FALLBACKS]


def entry_findings(secrets: list[str] | None = None) -> Iterator[Finding]:
    """Every entry whose code does not hold, or that has none."""
    secrets = secrets or _secrets()
    for entry in AuditEntry.objects.order_by("id").iterator(chunk_size=BATCH):
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


CHAIN = f"""
SELECT l.position, l.entry_id, l.mac, l.chain, e.id IS NOT NULL, e.mac
FROM {AuditLink._meta.db_table} l
LEFT JOIN {AuditEntry._meta.db_table} e ON e.id = l.entry_id
WHERE l.position > %s
ORDER BY l.position
"""


def chain_findings(secrets: list[str], *, since: Since | None = None) -> Iterator[Finding]:
    """Walk the chain's links in order (a server-side cursor), from its start or from
    `since`; from `since`, the codes of the entries linked after it are checked too
    (from the start, `entry_findings` checks every entry's)."""
    start, start_mac = chain_start()
    if since is None or since.position < start.position:
        since, checking = start, since is not None
    else:
        checking = True
    previous, expected = since.chain, since.position + 1
    if start.position and not any(
        start_code(start.position, start.chain, secret=s) == start_mac for s in secrets
    ):
        yield Finding(0, BROKEN, (
            f"the chain's start (link {start.position}, where retention removed the entries"
            " before it) was moved outside the console: entries before it may be missing"
        ))  # fmt: skip
    with connection.chunked_cursor() as cursor:
        cursor.execute(CHAIN, [expected - 1])
        while rows := cursor.fetchmany(BATCH):
            if checking:
                yield from _codes_of(rows, secrets)
            for row in rows:
                yield from _link_findings(previous, expected, row, secrets)
                previous, expected = row[3], row[0] + 1


def chain_start() -> tuple[Since, str]:
    """Where the chain starts (after the links retention removed, none at first), and
    the code that vouches for it."""
    head = ChainHead.objects.first()
    if head is None or not head.start_position:
        return Since(0, "", 0), ""
    return Since(head.start_position, head.start_chain, 0), head.start_mac


def _link_findings(previous: str, expected: int, row: tuple, secrets) -> Iterator[Finding]:
    """What one link (a row of CHAIN) shows, after the link `previous` at `expected - 1`."""
    position, entry_id, mac, chain, present, entry_mac = row
    if position != expected:
        yield _gap(expected, position, entry_id)
    if not any(chain_code(previous, entry_id, mac, secret=s) == chain for s in secrets):
        yield _broken(position, entry_id)
    if not present:
        yield Finding(entry_id, REMOVED, (
            f"entry {entry_id} (link {position}) was removed from the audit log"
        ))  # fmt: skip
    elif entry_mac != mac:
        yield Finding(entry_id, RELINKED, (
            f"entry {entry_id} (link {position}): its code was rewritten after it was linked"
        ))  # fmt: skip


def _codes_of(rows: list[tuple], secrets: list[str]) -> Iterator[Finding]:
    """The codes of the entries these links name (those still there)."""
    entries = AuditEntry.objects.in_bulk([row[1] for row in rows if row[4]])
    for entry_id in sorted(entries):
        finding = _finding(entries[entry_id], secrets)
        if finding is not None:
            yield finding


def _gap(expected: int, position: int, entry_id: int) -> Finding:
    return Finding(entry_id, BROKEN, (
        f"links {expected} to {position - 1} are missing before entry {entry_id}: "
        "removed from the chain"
    ))  # fmt: skip


def _broken(position: int, entry_id: int) -> Finding:
    return Finding(entry_id, BROKEN, (
        f"the chain breaks at link {position} (entry {entry_id}): that link was changed, "
        "or one before it removed"
    ))  # fmt: skip


def unlinked_findings(*, after: int = 0) -> Iterator[Finding]:
    """Entries that the chain's horizon says were linked, and are not (of transactions
    from `after` on)."""
    head = ChainHead.objects.first()
    if head is None:
        return
    unlinked = AuditEntry.objects.filter(txid__gte=after, txid__lt=head.horizon).exclude(
        id__in=AuditLink.objects.values("entry_id")
    )
    for entry_id in unlinked.order_by("id").values_list("id", flat=True).iterator(BATCH):
        yield Finding(entry_id, UNLINKED, (
            f"entry {entry_id} is not in the chain, though written before entries that are: "
            "written around the console"
        ))  # fmt: skip


def checkpoint_findings() -> Iterator[Finding]:
    """Checkpoints whose signature does not hold for a trusted public key, or whose link
    is gone or different: the chain was cut back, or made again, before them."""
    trusted = trusted_public_keys()
    checkpoints = Checkpoint.objects.order_by("signed_at", "id")
    for batch in _batches(checkpoints.iterator(BATCH)):
        positions = {c.position for c in batch}
        chains = dict(AuditLink.objects.filter(position__in=positions)
                      .values_list("position", "chain"))  # fmt: skip
        for checkpoint in batch:
            yield from _checkpoint_findings(checkpoint, trusted, chains)


def _batches(items: Iterator[Checkpoint]) -> Iterator[list[Checkpoint]]:
    while batch := list(islice(items, BATCH)):
        yield batch


def _checkpoint_findings(
    checkpoint: Checkpoint, trusted: set[str], chains: dict[int, str]
) -> Iterator[Finding]:
    if checkpoint.public_key not in trusted or not signature_holds(
        checkpoint.public_key, checkpoint.document(), checkpoint.signature
    ):
        yield Finding(0, UNSIGNED, (
            f"the checkpoint of {checkpoint.signed_at:%Y-%m-%d %H:%M:%S} (link "
            f"{checkpoint.position}) is not signed by a key the auditors trust"
        ))  # fmt: skip
    elif checkpoint.position and chains.get(checkpoint.position) != checkpoint.chain:
        yield Finding(0, CUT, (
            f"the chain was cut back or made again: link {checkpoint.position}, signed "
            f"at {checkpoint.signed_at:%Y-%m-%d %H:%M:%S}, is gone or not the one signed"
        ))  # fmt: skip


def stale_findings() -> Iterator[Finding]:
    """On a host that signs checkpoints, none for two intervals: the newest ones were
    removed (with the links after them, perhaps), or the beat stopped signing."""
    made = key_made_at()
    if made is None:
        return
    newest = Checkpoint.objects.order_by("-signed_at").first()
    since = timezone.now() - timedelta(seconds=2 * settings.AUDIT_CHECKPOINT_S)
    if made < since and (newest is None or newest.signed_at < since):
        when = "ever" if newest is None else f"since {newest.signed_at:%Y-%m-%d %H:%M:%S}"
        yield Finding(0, STALE, (
            f"no checkpoint of the chain {when}, though this host holds the audit key: "
            "the newest were removed, or the beat does not sign them"
        ))  # fmt: skip
