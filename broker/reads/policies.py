"""Reads of receivers' policies: the newest version of each."""

from __future__ import annotations

from collections.abc import Iterable

from broker.models import (
    Client,
    PolicyVersion,
)


def current_policy(client: Client) -> PolicyVersion | None:
    """The client's newest policy version, or None if it never set one."""
    return client.policy_versions.order_by("-version").first()


def newest_policies(
    client_ids: Iterable[int] | None = None, *, field: str = "canonical_text"
) -> dict[int, str]:
    """{client id: `field` of its newest policy version} for the clients given (or every
    client) that have one, in one query."""
    newest = PolicyVersion.objects.order_by("client_id", "-version").distinct("client_id")
    if client_ids is not None:
        newest = newest.filter(client_id__in=list(client_ids))
    return dict(newest.values_list("client_id", field))
