"""Exports of the audit log are themselves audited: who took which entries away."""

from __future__ import annotations

from broker import audit
from broker.audit import Actor
from broker.models import AuditEntry
from broker.reads.audit import AuditQuery

EXPORT_TARGET = "audit-log"


def record_export(*, actor: Actor, query: AuditQuery, file_format: str = "csv") -> AuditEntry:
    """Record that `actor` exported every entry `query` chooses (its filters and
    order, as the export's link states them)."""
    return audit.record_change(
        actor=actor,
        action="audit.export",
        target=EXPORT_TARGET,
        details={"format": file_format, "filter": query.params()},
    )
