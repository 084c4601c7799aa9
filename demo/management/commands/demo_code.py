"""Print the code a demo user's authenticator shows now."""

from django.core.management.base import BaseCommand, CommandError

from demo.second_factor import demo_code


class Command(BaseCommand):
    help = (
        "Print the second-factor code a demo user's demo authenticator shows now (the "
        "users ensure_demo_users made, and the admin). Real users' authenticators are "
        "never read out."
    )

    def add_arguments(self, parser):
        parser.add_argument("username")

    def handle(self, *args, username: str, **options):
        code = demo_code(username)
        if code is None:
            raise CommandError(f"{username!r} has no demo authenticator (see ensure_demo_users)")
        self.stdout.write(code)
