"""The audit chain's periodic task (the beat runs it every AUDIT_LINK_S)."""

from __future__ import annotations

from celery import shared_task

from auditchain import services


@shared_task(name="auditchain.link_entries")
def link_entries() -> int:
    """Link the audit entries written since the last run; idempotent."""
    return services.link_entries().entries
