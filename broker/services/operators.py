"""The console's operators: their API tokens (an integration acts with its operator's
permissions), lifting their login lockouts, and their second factor."""

from __future__ import annotations

from axes.utils import reset
from django.conf import settings
from django.db import transaction
from django.db.models.functions import Now
from django.utils import timezone
from django_otp import match_token
from django_otp.plugins.otp_static.models import StaticDevice, StaticToken
from django_otp.plugins.otp_totp.models import TOTPDevice

from broker import audit
from broker.audit import Actor
from broker.credentials import key_digest, new_secret, token_expiry
from broker.errors import AuthenticationFailed, InvalidInput
from broker.models import OperatorToken
from broker.reads.operators import ADDRESS, ENROLMENT_OPENED, USERNAME


def issue_operator_token(*, user, label: str, actor: Actor) -> str:
    """A new API token acting as `user`; returned this once, stored as a digest."""
    token = new_secret("sno")
    with transaction.atomic():
        OperatorToken.objects.create(
            user=user,
            label=label[:100],
            key_hash=key_digest(token),
            expires_at=token_expiry(settings.OPERATOR_TOKEN_DAYS),
        )
        audit.record_change(
            actor=actor,
            action="operator.issue_token",
            target=f"user:{user.username}",
            details={"label": label[:100]},
        )
    return token


def authenticate_operator(token: str):
    """The active user a live operator token belongs to, else AuthenticationFailed."""
    found = (
        OperatorToken.objects.select_related("user")
        .filter(
            key_hash=key_digest(token),
            revoked_at__isnull=True,
            expires_at__gt=Now(),
            user__is_active=True,
        )
        .first()
    )
    if found is None:
        raise AuthenticationFailed("the operator token is unknown, revoked or expired")
    OperatorToken.objects.filter(pk=found.pk).update(last_used_at=timezone.now())
    return found.user


def lift_lockout(*, kind: str, value: str, actor: Actor) -> int:
    """Forget the failed logins that lock out this username or address (kind: USERNAME
    or ADDRESS of broker.reads.operators); audited. The number of attempt rows removed."""
    if kind not in (USERNAME, ADDRESS):
        raise InvalidInput(f"a lockout is of a username or an address, not {kind!r}", field="kind")
    with transaction.atomic():
        removed = reset(username=value) if kind == USERNAME else reset(ip=value)
        audit.record_change(
            actor=actor,
            action="console.lift_lockout",
            target=f"{kind}:{value}"[: audit.SHORT_TEXT],
            details={"attempts_forgotten": removed},
        )
    return removed


AUTHENTICATOR = "authenticator"
RECOVERY_CODES = 10


def enrolment_device(*, user) -> TOTPDevice:
    """The authenticator `user` is enrolling: unconfirmed until a code from it is
    typed (made on first call, the same one after)."""
    device = _device_being_enrolled(user)
    return device or TOTPDevice.objects.create(user=user, name=AUTHENTICATOR, confirmed=False)


def _device_being_enrolled(user) -> TOTPDevice | None:
    return TOTPDevice.objects.filter(user=user, confirmed=False).first()


def confirm_enrolment(*, user, code: str, actor: Actor) -> tuple[TOTPDevice, list[str]]:
    """Confirm the authenticator being enrolled with a code it shows; it replaces any
    earlier one, with new recovery codes (returned this once). AuthenticationFailed if
    the code does not match (audited)."""
    device = _device_being_enrolled(user)
    if device is None or not device.verify_token(code.strip()):
        _refuse_code(user, actor, "the code does not match the authenticator being enrolled")
    with transaction.atomic():
        TOTPDevice.objects.filter(user=user).exclude(pk=device.pk).delete()
        StaticDevice.objects.filter(user=user).delete()
        device.confirmed = True
        device.save(update_fields=["confirmed"])
        codes = _new_recovery_codes(user)
        audit.record_change(
            actor=actor, action="operator.enrol_second_factor", target=f"user:{user.username}"
        )
    return device, codes


def _new_recovery_codes(user) -> list[str]:
    device = StaticDevice.objects.create(user=user, name="recovery codes", confirmed=True)
    codes = [StaticToken.random_token() for _ in range(RECOVERY_CODES)]
    StaticToken.objects.bulk_create(StaticToken(device=device, token=code) for code in codes)
    return codes


def check_second_factor(*, user, code: str, actor: Actor):
    """The device (authenticator, or recovery codes: a recovery code works once) that
    accepts `code` for `user`; AuthenticationFailed, audited, if none does. Each device
    slows down after failures (django-otp's throttling), so codes cannot be guessed."""
    device = match_token(user, code.strip().replace(" ", ""))
    if device is None:
        _refuse_code(
            user, actor, "the code is wrong, was used already, or came too soon after a wrong one"
        )
    if isinstance(device, StaticDevice):
        audit.record_change(
            actor=actor,
            action="operator.use_recovery_code",
            target=f"user:{user.username}",
            details={"left": device.token_set.count()},
        )
    return device


def _refuse_code(user, actor: Actor, reason: str) -> None:
    audit.record_refusal(
        actor=actor, action="console.second_factor", target=f"user:{user.username}", reason=reason
    )
    raise AuthenticationFailed(reason, field="code")


def reset_second_factor(*, user, actor: Actor) -> None:
    """Remove `user`'s authenticator and recovery codes (a lost phone), and open
    enrolment for them (SECOND_FACTOR_ENROL_DAYS): they enrol again at their next
    login. Audited."""
    with transaction.atomic():
        TOTPDevice.objects.filter(user=user).delete()
        StaticDevice.objects.filter(user=user).delete()
        TOTPDevice.objects.create(user=user, name=ENROLMENT_OPENED, confirmed=False)
        audit.record_change(
            actor=actor, action="operator.reset_second_factor", target=f"user:{user.username}"
        )


def revoke_operator_token(*, token: OperatorToken, actor: Actor) -> None:
    """Revoke one operator's API token (audited); its integration is refused from now."""
    with transaction.atomic():
        OperatorToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(
            revoked_at=timezone.now()
        )
        audit.record_change(
            actor=actor,
            action="operator.revoke_token",
            target=f"user:{token.user.username}",
            details={"label": token.label, "token": token.pk},
        )
