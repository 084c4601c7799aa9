"""Create one demo user per console role once, printing each generated password once."""

import secrets

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management.base import BaseCommand

from broker.audit import Actor
from broker.models import Client
from broker.reads.sending import sending_holders
from broker.roles import ADMIN, AUDITOR, OPERATOR, POLICY_AUTHOR, TRUST_OFFICER, sync_roles
from broker.services.sending import grant_sending

PASSWORD_BYTES = 12
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
        if created:
            self.stdout.write("Demo users, shown only now:\n" + "\n".join(created))
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
