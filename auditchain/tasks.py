"""The audit chain's periodic task (the beat runs it every AUDIT_LINK_S)."""

from __future__ import annotations

from celery import shared_task

from auditchain import services


@shared_task(name="auditchain.link_entries")
def link_entries() -> int:
    """Link the audit entries written since the last run; idempotent."""
    return services.link_entries().entries


@shared_task(name="auditchain.verify_log")
def verify_log() -> int:
    """Verify what was linked or written since the last verification, and record the
    outcome for the audit page; idempotent."""
    return services.verify_since_last().found


@shared_task(name="auditchain.sign_checkpoint")
def sign_checkpoint() -> int | None:
    """Sign the chain's head (nothing if this host holds no audit key)."""
    checkpoint = services.sign_checkpoint()
    return None if checkpoint is None else checkpoint.position
