"""What the console shows of the audit chain: its state on the audit page, and each
exported entry's link."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from auditchain.models import AuditLink, ChainHead, Checkpoint


@dataclass(frozen=True)
class ChainState:
    """The last verification's outcome (None: never verified) and the chain's length."""

    verified_at: datetime | None
    entries: int
    links: int
    findings: int
    first_finding: str
    checkpoint_at: datetime | None  # the newest signed checkpoint's time


def chain_state() -> ChainState:
    """As the chain's head records it: one row, no scan of the log."""
    head = ChainHead.objects.first() or ChainHead()
    return ChainState(
        verified_at=head.verified_at, entries=head.verified_entries,
        links=head.verified_links, findings=head.findings,
        first_finding=head.first_finding,
        checkpoint_at=Checkpoint.objects.order_by("-signed_at")
        .values_list("signed_at", flat=True).first(),
    )  # fmt: skip


def links_of(entry_ids: Iterable[int]) -> dict[int, tuple[int, str]]:
    """{entry id: (its position in the chain, the link's code)} for those linked."""
    links = AuditLink.objects.filter(entry_id__in=list(entry_ids))
    return {e: (p, c) for e, p, c in links.values_list("entry_id", "position", "chain")}
