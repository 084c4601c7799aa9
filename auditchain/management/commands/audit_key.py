"""manage.py audit_key: make the console's audit key on this host if it holds none
(SIGNING_KEYS_DIR/console/audit.pem, 0600), and print its public key, for the auditors
to keep outside the database (AUDIT_CHECKPOINT_KEYS on the hosts that verify)."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from auditchain.keys import make_audit_key, public_key_text
from broker.errors import BrokerError


class Command(BaseCommand):
    help = "Make the audit key if missing; print its public key."

    def handle(self, *args, **options) -> None:
        try:
            key = make_audit_key()
        except BrokerError as error:
            raise CommandError(error.message) from None
        except OSError as error:
            raise CommandError(str(error)) from None
        self.stdout.write(public_key_text(key))
