"""Reads of the event service that several callers reuse."""

from __future__ import annotations

from django.db.models import Q, QuerySet
from django.utils import timezone

from broker.models import AttributeValue, Client, PolicyVersion


def declared_types(client: Client) -> dict[str, str]:
    """{attribute name: type} of the client's model."""
    return dict(client.model.attributes.values_list("name", "type"))


def live_attribute_values(*, now=None) -> QuerySet[AttributeValue]:
    """Values that are neither revoked nor expired: the one rule for "current"."""
    now = now or timezone.now()
    return AttributeValue.objects.filter(revoked_at__isnull=True).filter(
        Q(expires_at__isnull=True) | Q(expires_at__gt=now)
    )


def live_values(client: Client, *, now=None) -> QuerySet[AttributeValue]:
    """The client's values that are neither revoked nor expired."""
    return live_attribute_values(now=now).filter(client=client)


def current_attributes(client: Client, *, now=None) -> dict:
    """Every live value, whoever set it: what selectors address."""
    return dict(live_values(client, now=now).values_list("name", "value"))


def attested_attributes(client: Client, *, now=None) -> dict:
    """Only values an authority attested: what receivers' policies see as `sender.x`."""
    values = live_values(client, now=now).filter(source=AttributeValue.Source.AUTHORITY)
    return dict(values.values_list("name", "value"))


def current_policy(client: Client) -> PolicyVersion | None:
    """The client's newest policy version, or None if it never set one."""
    return client.policy_versions.order_by("-version").first()
