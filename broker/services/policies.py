"""Receivers' connectivity policies, versioned."""

from __future__ import annotations

from django.db import transaction
from django.db.models import Max

from broker import audit
from broker.audit import Actor
from broker.dispatch import entry
from broker.errors import NotAuthorised, PolicyRejected
from broker.models import Client, PolicyVersion
from broker.selectors import vocabulary
from policies import PolicySyntaxError

MAX_POLICY_LENGTH = 20_000


def set_policy(*, client: Client, text: str, actor: Actor) -> PolicyVersion:
    """Parse and store a new version of the client's policy; refuse it whole if invalid."""
    with audit.refusals_recorded(
        actor=actor,
        action="policy.set",
        target=f"client:{client.name}",
        details={"text": text[:MAX_POLICY_LENGTH]},
    ):
        if not client.can_receive:
            raise NotAuthorised(f"{client.name} is not a receiver", field="policy")
        canonical = _canonical(text)
    with transaction.atomic():
        # Lock the client row: two concurrent updates must not take the same number.
        Client.objects.select_for_update().filter(pk=client.pk).first()
        latest = client.policy_versions.aggregate(latest=Max("version"))["latest"] or 0
        version = PolicyVersion.objects.create(
            client=client,
            version=latest + 1,
            text=text,
            canonical_text=canonical,
            created_by=str(actor),
        )
        audit.record_change(
            actor=actor,
            action="policy.set",
            target=f"client:{client.name}",
            details={"version": version.version, "policy": canonical},
        )
        entry.client_changed(client)
    return version


def _canonical(text: str) -> str:
    if len(text) > MAX_POLICY_LENGTH:
        raise PolicyRejected(
            f"the policy is longer than {MAX_POLICY_LENGTH} characters",
            field="policy",
            line=1,
            column=1,
        )
    try:
        # Typed as the leaves will type it: `sender.x` by the senders' models, `event.x`
        # by the declared event attributes (docs/addressing.md).
        return vocabulary().policy(text).text()
    except PolicySyntaxError as error:
        raise PolicyRejected(
            str(error), field="policy", line=error.line, column=error.column
        ) from None
