"""manage.py verify_audit: check every audit entry's authentication code; name each
entry it does not hold for. Exit status 0 when every entry verifies, 1 otherwise."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

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
        if found:
            raise CommandError(
                f"the audit log does not verify: {found} of {checked} entries"
                + (f" ({found - limit} more not named)" if found > limit else "")
            )
        self.stdout.write(
            f"the audit log verifies: {checked} entries, each as the console wrote it"
        )
