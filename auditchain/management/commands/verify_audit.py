"""manage.py verify_audit: check every audit entry's authentication code and the chain
that orders them (auditchain.verification); name each entry the evidence does not
vouch for, and why. Exit status 0 when the log verifies, 1 otherwise."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from auditchain.models import ChainHead
from auditchain.verification import findings
from broker.models import AuditEntry


class Command(BaseCommand):
    help = "Check the audit log: every entry as the console wrote it, or which one is not."

    def add_arguments(self, parser) -> None:
        parser.add_argument(
            "--limit", type=int, default=100, help="entries named at most (all are counted)"
        )

    def handle(self, *args, limit: int, **options) -> None:
        found = 0
        for finding in findings():
            found += 1
            if found <= limit:
                self.stdout.write(finding.message)
        checked = AuditEntry.objects.count()
        head = ChainHead.objects.first()
        linked = head.position if head else 0
        if found:
            raise CommandError(
                f"the audit log does not verify: {found} findings over {checked} entries"
                f" and {linked} links" + (f" ({found - limit} not shown)" if found > limit else "")
            )
        self.stdout.write(
            f"the audit log verifies: {checked} entries as the console wrote them,"
            f" {linked} of them linked in the order they were written"
        )
