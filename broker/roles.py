"""The console's roles, as Django groups, and what each may do.

A permission says what an action needs; a role is a group holding permissions. Every
role reads everything the console shows (the auditor only that); the others add one
kind of change each, and the admin holds them all. Pages and actions ask for a
permission (console.access), never for a role, so that a site may compose its own.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.contrib.auth.models import Group, Permission
from django.db import transaction

# What each kind of action needs (Django's model permissions of the broker app).
READ = "broker.view_client"
READ_AUDIT = "broker.view_auditentry"
SEND = "broker.add_event"
MANAGE_CLIENTS = "broker.change_client"
AUTHOR_POLICIES = "broker.add_policyversion"
ATTEST = "broker.change_attributevalue"
MANAGE_AUTHORITIES = "broker.change_authority"
# Sending as a particular sender also needs that sender's object permission, granted
# per sender client (or globally, for every sender); deciding who holds it is the admin's.
SEND_AS = "broker.send_as_client"
DELEGATE_SENDING = "broker.delegate_sending"
# Console accounts: lockouts, and (in Django's admin) users and their roles; the admin's.
MANAGE_ACCOUNTS = "auth.change_user"
# Reports (docs/reports.md): every role reads them (the audit review also needs
# READ_AUDIT); operators and auditors start them.
READ_REPORTS = "reports.view_reportrun"
RUN_REPORTS = "reports.add_reportrun"

# What changes anything: a user who may do one of these needs a second factor.
CHANGES = (
    SEND, MANAGE_CLIENTS, AUTHOR_POLICIES, ATTEST, MANAGE_AUTHORITIES, SEND_AS,
    DELEGATE_SENDING, MANAGE_ACCOUNTS,
)  # fmt: skip


def needs_second_factor(user) -> bool:
    """Whether `user` may change anything (a role of CHANGES, staff, superuser), and so
    must prove a second factor before any page (docs/security.md)."""
    if not user.is_authenticated:
        return False
    return user.is_superuser or user.is_staff or any(user.has_perm(p) for p in CHANGES)


@dataclass(frozen=True)
class Role:
    """A group of the console: its name, what it is for, and what it may change."""

    name: str
    purpose: str
    grants: tuple[str, ...] = ()  # beyond reading what the console shows
    everything: bool = False


OPERATOR = Role(
    "operator", "sends events, manages clients' tokens, runs reports",
    (SEND, MANAGE_CLIENTS, RUN_REPORTS),
)  # fmt: skip
POLICY_AUTHOR = Role("policy author", "writes and saves receivers' policies", (AUTHOR_POLICIES,))
TRUST_OFFICER = Role(
    "trust officer", "attests attributes and manages authorities", (ATTEST, MANAGE_AUTHORITIES)
)
AUDITOR = Role(
    "auditor", "reads everything, runs reports, changes nothing", (READ_AUDIT, RUN_REPORTS)
)
ADMIN = Role("admin", "everything, including users and roles", everything=True)
ROLES = (OPERATOR, POLICY_AUTHOR, TRUST_OFFICER, AUDITOR, ADMIN)


def role_needed_for(permission: str) -> str:
    """The plain name of the role(s) that grant `permission`, for refusals."""
    names = [role.name for role in ROLES if permission in role.grants and not role.everything]
    return " or ".join(names) or ADMIN.name


def _codename(permission: str) -> tuple[str, str]:
    app_label, codename = permission.split(".", 1)
    return app_label, codename


def _permissions_of(role: Role) -> list[Permission]:
    if role.everything:
        apps = ("broker", "reports", "auth")
        return list(Permission.objects.filter(content_type__app_label__in=apps))
    reads = Permission.objects.filter(
        content_type__app_label__in=("broker", "reports"), codename__startswith="view_"
    ).exclude(codename="view_auditentry")
    wanted = [_codename(p) for p in role.grants]
    granted = [Permission.objects.get(content_type__app_label=a, codename=c) for a, c in wanted]
    return [*reads, *granted]


@transaction.atomic
def sync_roles() -> list[Group]:
    """Create the roles' groups and give each exactly its permissions (idempotent)."""
    groups = []
    for role in ROLES:
        group, _ = Group.objects.get_or_create(name=role.name)
        group.permissions.set(_permissions_of(role))
        groups.append(group)
    return groups
