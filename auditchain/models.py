"""The audit chain: each audit entry's place in the order the entries were written."""

from __future__ import annotations

from django.db import models


class AuditLink(models.Model):
    """An audit entry's place in the chain. Links are made in the order the entries'
    transactions ended, each one's `chain` an HMAC (keyed as the entries' codes are) of
    the link before it, the entry's id and its code: an entry removed leaves its link
    behind, and a link changed or removed breaks every code after it, which nobody
    without the console's key can make again."""

    position = models.BigIntegerField(primary_key=True)
    # No foreign key: an entry deleted must leave its link, as evidence.
    entry_id = models.BigIntegerField(unique=True)
    mac = models.CharField(max_length=64)  # the entry's code when it was linked
    chain = models.CharField(max_length=64)
    linked_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"link {self.position}: entry {self.entry_id}"


class ChainHead(models.Model):
    """The chain's last link, and how far the entries are linked: every entry written
    by a transaction before `horizon` (PostgreSQL's transaction ids) has its link. One
    row."""

    position = models.BigIntegerField(default=0)
    chain = models.CharField(max_length=64, blank=True, default="")
    horizon = models.BigIntegerField(default=0)
    linked_at = models.DateTimeField(null=True, blank=True)
    # Where the chain starts once retention removed its oldest entries and links
    # (auditchain.services.trim_through): the last link removed, and its code
    # (broker.audit.start_code), which only the console can make.
    start_position = models.BigIntegerField(default=0)
    start_chain = models.CharField(max_length=64, blank=True, default="")
    start_mac = models.CharField(max_length=64, blank=True, default="")
    # The last verification (auditchain.services.record_verification): when, what it
    # covered, how many findings and the first of them, for the audit page.
    verified_at = models.DateTimeField(null=True, blank=True)
    verified_entries = models.BigIntegerField(default=0)
    verified_links = models.BigIntegerField(default=0)
    findings = models.BigIntegerField(default=0)
    first_finding = models.TextField(blank=True, default="")
    # Where it ended: the next one, run by the beat, starts there
    # (auditchain.verification.Since).
    verified_position = models.BigIntegerField(default=0)
    verified_chain = models.CharField(max_length=64, blank=True, default="")
    verified_horizon = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return f"chain head at {self.position}"


class Checkpoint(models.Model):
    """The chain's head at a moment, signed with the console's audit key
    (auditchain.keys), whose private half is never in the database: whoever checks it
    with the public key knows the chain ran through `chain` at `position` then, so that
    links before it can be neither cut off nor made again unseen."""

    position = models.BigIntegerField()
    chain = models.CharField(max_length=64, blank=True)
    signed_at = models.DateTimeField()
    public_key = models.CharField(max_length=100)
    signature = models.CharField(max_length=100)

    class Meta:
        ordering = ["signed_at"]

    def __str__(self) -> str:
        return f"checkpoint at link {self.position}, {self.signed_at:%Y-%m-%d %H:%M}"

    def document(self) -> dict:
        """What is signed."""
        return {
            "signed": "sn-audit-checkpoint",
            "position": self.position,
            "chain": self.chain,
            "signed_at": self.signed_at.isoformat(timespec="microseconds"),
        }
