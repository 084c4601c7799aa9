"""The audit log: every change and every refusal, with actor and reason.

Changes are written in the same transaction as the change, so they stand or fall
together. Refusals are written through the `audit` database alias, a connection of its
own in autocommit mode, so that a refusal is recorded even when the caller's
transaction is rolled back because of it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from django.utils import timezone

from broker.errors import BrokerError
from broker.models import AuditEntry

REFUSALS_DATABASE = "audit"


@dataclass(frozen=True)
class Actor:
    """Who acts: an operator (`user`), a client, an authority or the system."""

    kind: str
    name: str

    def __str__(self) -> str:
        return f"{self.kind}:{self.name}"


SYSTEM = Actor("system", "broker")


def record_change(
    *, actor: Actor, action: str, target: str, details: dict | None = None
) -> AuditEntry:
    """Record a change, inside the caller's transaction."""
    return AuditEntry.objects.create(
        at=timezone.now(),
        actor=str(actor),
        action=action,
        target=target,
        outcome=AuditEntry.Outcome.DONE,
        details=details or {},
    )


@contextmanager
def refusals_recorded(
    *, actor: Actor, action: str, target: str, details: dict | None = None
) -> Iterator[None]:
    """Check inputs inside this block: a BrokerError raised there is audited as a
    refusal (with the offending field) and raised again."""
    try:
        yield
    except BrokerError as error:
        record_refusal(
            actor=actor,
            action=action,
            target=target,
            reason=error.message,
            details={**(details or {}), "field": error.field},
        )
        raise


def record_refusal(
    *, actor: Actor, action: str, target: str, reason: str, details: dict | None = None
) -> AuditEntry:
    """Record a refusal on its own connection, so that no rollback can lose it."""
    return AuditEntry.objects.using(REFUSALS_DATABASE).create(
        at=timezone.now(),
        actor=str(actor),
        action=action,
        target=target,
        outcome=AuditEntry.Outcome.REFUSED,
        reason=reason,
        details=details or {},
    )
