"""Receivers' connectivity policies, versioned."""

from __future__ import annotations

from django.db import transaction
from django.db.models import Max

from broker import audit
from broker.audit import Actor
from broker.dispatch import entry
from broker.errors import InvalidInput, NotAuthorised, PolicyRejected
from broker.models import Client, PolicyVersion
from broker.reads.policies import current_policy
from broker.vocabulary import vocabulary
from policies import PolicySyntaxError

MAX_POLICY_LENGTH = 20_000


def set_policy(*, client: Client, text: str, actor: Actor) -> PolicyVersion:
    """Parse and store a new version of the client's policy; refuse it whole if invalid.
    The same text stated again (an agent states its policy at every login) is no new
    version: the current one is returned."""
    with audit.refusals_recorded(
        actor=actor,
        action="policy.set",
        target=f"client:{client.name}",
        details={"text": text[:MAX_POLICY_LENGTH]},
    ):
        if not client.can_receive:
            raise NotAuthorised(f"{client.name} is not a receiver", field="policy")
        current = current_policy(client)
        if current is not None and current.text == text:
            # Found before parsing and locking: every agent's login states its policy.
            return current
        canonical = canonical_policy(text)
    with transaction.atomic():
        # Lock the client row: two concurrent updates must not take the same number.
        Client.objects.select_for_update().filter(pk=client.pk).first()
        current = current_policy(client)
        if current is not None and current.text == text:
            return current
        version = PolicyVersion.objects.create(
            client=client,
            version=(current.version if current else 0) + 1,
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


def set_policies(
    *, clients: list[Client], text: str, actor: Actor, selection: str = ""
) -> list[PolicyVersion]:
    """Save one policy as the next version of every client in `clients` (chosen by
    `selection`, a selector or a name, said in the audit entry): all of them or none.
    One audit entry names the clients; the leaves learn of each change."""
    target = f"clients:{len(clients)}"
    with audit.refusals_recorded(
        actor=actor, action="policy.set", target=target,
        details={"text": text[:MAX_POLICY_LENGTH], "selection": selection},
    ):  # fmt: skip
        _check_receivers(clients)
        canonical = canonical_policy(text)
    with transaction.atomic():
        ids = sorted(client.pk for client in clients)
        # Lock the rows in one order: concurrent saves must not take the same numbers.
        list(Client.objects.select_for_update().filter(pk__in=ids).order_by("pk").values("pk"))
        latest = dict(
            PolicyVersion.objects.filter(client_id__in=ids)
            .values("client_id")
            .annotate(latest=Max("version"))
            .values_list("client_id", "latest")
        )
        versions = PolicyVersion.objects.bulk_create(
            PolicyVersion(
                client=client, version=latest.get(client.pk, 0) + 1, text=text,
                canonical_text=canonical, created_by=str(actor),
            )
            for client in clients
        )  # fmt: skip
        audit.record_change(
            actor=actor, action="policy.set", target=target,
            details={"policy": canonical, "selection": selection,
                     "clients": audit.listed([c.name for c in clients])},
        )  # fmt: skip
        entry.clients_changed(clients)
    return versions


def _check_receivers(clients: list[Client]) -> None:
    if not clients:
        raise InvalidInput("no receiver is selected: choose a client or a selector", field="target")
    senders_only = [client.name for client in clients if not client.can_receive]
    if senders_only:
        names = ", ".join(senders_only[:5]) + (" and others" if len(senders_only) > 5 else "")
        raise NotAuthorised(
            f"{names} cannot receive, so cannot have a policy: narrow the selection",
            field="target",
        )


def canonical_policy(text: str) -> str:
    """The policy's canonical text, typed by the current vocabulary; PolicyRejected
    (with line and column) if it is too long or does not parse."""
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
