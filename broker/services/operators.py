"""Operators' API tokens: an integration acts with its operator's permissions."""

from __future__ import annotations

from axes.utils import reset
from django.db import transaction
from django.utils import timezone

from broker import audit
from broker.audit import Actor
from broker.credentials import key_digest, new_secret
from broker.errors import AuthenticationFailed, InvalidInput
from broker.models import OperatorToken
from broker.reads.operators import ADDRESS, USERNAME


def issue_operator_token(*, user, label: str, actor: Actor) -> str:
    """A new API token acting as `user`; returned this once, stored as a digest."""
    token = new_secret("sno")
    with transaction.atomic():
        OperatorToken.objects.create(user=user, label=label[:100], key_hash=key_digest(token))
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
        .filter(key_hash=key_digest(token), revoked_at__isnull=True, user__is_active=True)
        .first()
    )
    if found is None:
        raise AuthenticationFailed("the operator token is unknown or revoked")
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
