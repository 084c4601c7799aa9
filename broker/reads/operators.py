"""The console's operators: logins locked out for too many failures (django-axes keeps
the failed attempts; broker.services.operators lifts lockouts), and their second factor."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from axes.models import AccessAttempt
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db.models import Count, Max, Sum
from django.utils import timezone
from django_otp.plugins.otp_static.models import StaticToken
from django_otp.plugins.otp_totp.models import TOTPDevice

from broker.roles import needs_second_factor

USERNAME = "username"
ADDRESS = "address"


@dataclass(frozen=True)
class Lockout:
    """A username or an address refused at login until `until`."""

    kind: str  # USERNAME or ADDRESS
    value: str
    failures: int
    last_failure: datetime

    @property
    def until(self) -> datetime:
        return self.last_failure + settings.AXES_COOLOFF_TIME


def current_lockouts() -> list[Lockout]:
    """Every username and address with AXES_FAILURE_LIMIT failed logins or more within
    the cool-off before its last one, counted as django-axes counts them; latest first."""
    recent = AccessAttempt.objects.filter(
        attempt_time__gte=timezone.now() - settings.AXES_COOLOFF_TIME
    )
    found = [
        Lockout(kind, row[field] or "", row["failures"], row["last"])
        for kind, field in ((USERNAME, "username"), (ADDRESS, "ip_address"))
        for row in recent.values(field)
        .annotate(failures=Sum("failures_since_start"), last=Max("attempt_time"))
        .filter(failures__gte=settings.AXES_FAILURE_LIMIT)
    ]
    return sorted(found, key=lambda lockout: lockout.last_failure, reverse=True)


def has_second_factor(user) -> bool:
    """Whether `user` has enrolled an authenticator (a confirmed TOTP device)."""
    return TOTPDevice.objects.filter(user=user, confirmed=True).exists()


def recovery_codes_left(user) -> int:
    """How many of `user`'s recovery codes are still unused."""
    return StaticToken.objects.filter(device__user=user, device__confirmed=True).count()


@dataclass(frozen=True)
class OperatorFactor:
    """A console user, whether their roles need a second factor, and theirs."""

    username: str
    roles: str
    needs_it: bool
    enrolled: bool
    codes_left: int


def second_factors() -> list[OperatorFactor]:
    """Every active console user by name, with where their second factor stands."""
    users = get_user_model().objects.filter(is_active=True).prefetch_related("groups")
    enrolled = set(
        TOTPDevice.objects.filter(confirmed=True).values_list("user__username", flat=True)
    )
    codes = dict(StaticToken.objects.values_list("device__user__username").annotate(Count("id")))
    return [
        OperatorFactor(
            username=user.username,
            roles=", ".join(group.name for group in user.groups.all()),
            needs_it=needs_second_factor(user),
            enrolled=user.username in enrolled,
            codes_left=codes.get(user.username, 0),
        )
        for user in users.order_by("username")
    ]


# The unconfirmed device an admin's reset leaves: enrolment is open from its creation.
ENROLMENT_OPENED = "enrolment opened by an admin"


def may_enrol(user) -> bool:
    """Whether `user`, who has no authenticator, may enrol one now: within
    SECOND_FACTOR_ENROL_DAYS of their account's creation or of an admin opening
    enrolment for them (broker.services.operators.reset_second_factor)."""
    if has_second_factor(user):
        return False
    opened = TOTPDevice.objects.filter(user=user, name=ENROLMENT_OPENED, confirmed=False)
    since = max([user.date_joined, *opened.values_list("created_at", flat=True)])
    return since >= timezone.now() - timedelta(days=settings.SECOND_FACTOR_ENROL_DAYS)
