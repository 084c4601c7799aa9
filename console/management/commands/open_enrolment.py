"""Open second-factor enrolment for a user (after an upgrade, or for an admin who has
no other admin to do it on the Sign-in page)."""

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from broker.audit import Actor
from broker.services.operators import reset_second_factor


class Command(BaseCommand):
    help = (
        "Remove a user's authenticator and recovery codes, if any, and open enrolment "
        "for them for SECOND_FACTOR_ENROL_DAYS: they set up a new one at their next "
        "login. Audited. For an upgrade (users made before the second factor existed) "
        "or an admin locked out with no other admin."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("username")

    def handle(self, *args, username: str, **options) -> None:
        user = get_user_model().objects.filter(username=username, is_active=True).first()
        if user is None:
            raise CommandError(f"no active user named {username!r}")
        reset_second_factor(user=user, actor=Actor("system", "manage.py"))
        self.stdout.write(f"{username} sets up a second factor at their next login.")
