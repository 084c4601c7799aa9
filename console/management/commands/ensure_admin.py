"""Create the first administrator once, printing its generated password once."""

import secrets

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

PASSWORD_BYTES = 12


class Command(BaseCommand):
    help = (
        "Create an administrator with a generated password if no superuser exists yet. "
        "The password is printed this one time and stored only as a hash."
    )

    def add_arguments(self, parser):
        parser.add_argument("--username", default="admin")

    def handle(self, *args, username: str, **options):
        users = get_user_model()
        if users.objects.filter(is_superuser=True).exists():
            self.stdout.write(
                "An administrator already exists (its password was printed when it was "
                "created; reset it with `manage.py changepassword`)."
            )
            return
        password = secrets.token_urlsafe(PASSWORD_BYTES)
        users.objects.create_superuser(username=username, email="", password=password)
        self.stdout.write(
            self.style.SUCCESS(
                f"Created administrator {username!r} with password: {password}\n"
                "This password is shown only now; store it safely."
            )
        )
