"""manage.py after_restore: whether the console may run on this database, restored
from a logical dump, or what to run first (lifecycle.reads, docs/operations.md).
Exit status 0 when it may, 1 when the transaction counter must be moved first."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from lifecycle.reads import transaction_counter


class Command(BaseCommand):
    help = "Check that the database's transaction counter is past every stored row's."

    def add_arguments(self, parser) -> None:
        parser.add_argument(
            "--pgdata", default="PGDATA", help="the server's data folder, to print in the command"
        )

    def handle(self, *args, pgdata: str, **options) -> None:
        counter = transaction_counter()
        if not counter.behind:
            self.stdout.write(
                f"the transaction counter ({counter.next_value:,}) is past every stored row's"
                f" and watermark ({counter.needed:,}): the console may run on this database"
            )
            return
        self.stdout.write(
            f"the transaction counter is at {counter.next_value:,}, below what the rows"
            f" restored here were written at ({counter.needed:,}, {counter.needed_by}):"
            " this database was restored from a logical dump. Before any process of the"
            " console starts, move the counter's epoch past them, on the server's host,"
            " as the user that runs it:\n"
            f"  pg_ctl stop -D {pgdata} -m fast\n"
            f"  pg_resetwal -e {counter.epoch_needed} -D {pgdata}\n"
            f"  pg_ctl start -D {pgdata}\n"
            'then run this command again (docs/operations.md, "Restoring").'
        )
        raise CommandError("the transaction counter is behind the restored rows")
