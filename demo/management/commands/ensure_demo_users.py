"""Create one demo user per console role once, printing each generated password once;
give them and the admins a demo authenticator whose codes `manage.py demo_code USER`
prints (docs/console.md)."""

import secrets

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management.base import BaseCommand
from django_otp.plugins.otp_totp.models import TOTPDevice

from broker.audit import Actor
from broker.models import Client
from broker.reads.sending import sending_holders
from broker.roles import ADMIN, AUDITOR, OPERATOR, POLICY_AUTHOR, TRUST_OFFICER, sync_roles
from broker.services.sending import grant_sending
from demo.second_factor import DEMO_AUTHENTICATOR

PASSWORD_BYTES = 12
CODES_HINT = (
    "  every role but the auditor also types a code after its password: "
    ".venv/bin/python manage.py demo_code USER prints the current one"
)
DEMO_USERS = {
    "operator": OPERATOR,
    "author": POLICY_AUTHOR,
    "officer": TRUST_OFFICER,
    "auditor": AUDITOR,
}


class Command(BaseCommand):
    help = (
        "Create the demo's users, one per role (operator, author, officer, auditor), "
        "each with a generated password printed this one time; the admin holds the "
        f"{ADMIN.name!r} role too. The {OPERATOR.name!r} role may send as every sender "
        "client there is (run it after load_scenario)."
    )

    def handle(self, *args, **options):
        sync_roles()
        users = get_user_model()
        created = []
        for username, role in DEMO_USERS.items():
            if users.objects.filter(username=username).exists():
                continue
            password = secrets.token_urlsafe(PASSWORD_BYTES)
            user = users.objects.create_user(username=username, password=password)
            user.groups.add(Group.objects.get(name=role.name))
            created.append(f"  {username:<9} {password}  ({role.name}: {role.purpose})")
        self._add_admins_to_admin_role(users)
        self._let_operators_send_as_senders()
        names = [
            *DEMO_USERS,
            *users.objects.filter(is_superuser=True).values_list("username", flat=True),
        ]
        give_demo_authenticators(users.objects.filter(username__in=names))
        if created:
            self.stdout.write("Demo users, shown only now:\n" + "\n".join(created))
            self.stdout.write(CODES_HINT)
        else:
            self.stdout.write("The demo users exist (their passwords were shown when made).")

    def _add_admins_to_admin_role(self, users) -> None:
        admin_role = Group.objects.get(name=ADMIN.name)
        for user in users.objects.filter(is_superuser=True):
            user.groups.add(admin_role)

    def _let_operators_send_as_senders(self) -> None:
        operators = Group.objects.get(name=OPERATOR.name)
        demo = Actor("system", "demo")
        for sender in Client.objects.filter(can_send=True).order_by("name"):
            if f"group:{operators.name}" not in sending_holders(sender):
                grant_sending(client=sender, holder=operators, actor=demo)


def give_demo_authenticators(users) -> None:
    """A confirmed demo authenticator for each of `users` who has none."""
    for user in users:
        if not TOTPDevice.objects.filter(user=user, confirmed=True).exists():
            TOTPDevice.objects.create(user=user, name=DEMO_AUTHENTICATOR, confirmed=True)
