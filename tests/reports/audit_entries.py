"""Audit entries written straight to the database: rows for the export and the kept
tables' tests, with no service or worker behind them."""

from __future__ import annotations

from django.utils import timezone

from broker.models import AuditEntry


def audit_entry(action: str, *, actor: str = "user:olivia") -> AuditEntry:
    """A done entry of `action` by `actor`, at this moment."""
    return AuditEntry.objects.create(
        at=timezone.now(), actor=actor, action=action, target="t", outcome="done"
    )
