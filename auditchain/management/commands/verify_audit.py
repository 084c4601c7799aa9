"""manage.py verify_audit: check every audit entry's authentication code and the chain
that orders them (auditchain.verification); name each entry the evidence does not
vouch for, and why, and record the outcome for the audit page. Exit status 0 when the
log verifies, 1 otherwise."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from auditchain.services import verify_log


class Command(BaseCommand):
    help = "Check the audit log: every entry as the console wrote it, or which one is not."

    def add_arguments(self, parser) -> None:
        parser.add_argument(
            "--limit", type=int, default=100, help="findings named at most (all are counted)"
        )

    def handle(self, *args, limit: int, **options) -> None:
        outcome = verify_log(listed=limit)
        for finding in outcome.listed:
            self.stdout.write(finding.message)
        if outcome.found:
            unnamed = outcome.found - len(outcome.listed)
            raise CommandError(
                f"the audit log does not verify: {outcome.found} findings over"
                f" {outcome.entries} entries and {outcome.links} links"
                + (f" ({unnamed} not shown)" if unnamed else "")
            )
        self.stdout.write(
            f"the audit log verifies: {outcome.entries} entries as the console wrote them,"
            f" {outcome.links} of them linked in the order they were written"
        )
