"""Issue an HTTP API token for an operator (printed once)."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from broker.audit import Actor
from broker.services.operators import issue_operator_token


class Command(BaseCommand):
    help = "Issue an API token acting with an operator's permissions; it is shown once."

    def add_arguments(self, parser) -> None:
        parser.add_argument("username")
        parser.add_argument("--label", default="integration")

    def handle(self, *args, username: str, label: str, **options) -> None:
        user = get_user_model().objects.filter(username=username, is_active=True).first()
        if user is None:
            raise CommandError(f"no active operator named {username!r}")
        token = issue_operator_token(user=user, label=label, actor=Actor("system", "manage.py"))
        self.stdout.write(token)
