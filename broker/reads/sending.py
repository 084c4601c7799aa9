"""Who may send as a sender client from the console (broker.services.sending
writes the grants)."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.db.models import QuerySet
from guardian.models import GroupObjectPermission, UserObjectPermission

from broker.models import (
    Client,
    SendTemplate,
)
from broker.roles import SEND, SEND_AS


# The per-sender grants are django-guardian's rows, read and written by the permission's
# natural key: guardian's own shortcuts go through a per-process content type cache,
# which a long-lived web process may hold stale (a test database flushed under it).
def send_as_permission() -> Permission:
    """The permission row of sending as a sender client."""
    app_label, codename = SEND_AS.split(".", 1)
    return Permission.objects.select_related("content_type").get(
        content_type__app_label=app_label, codename=codename
    )


def granted_sender_ids(user) -> set[int]:
    """Ids of the senders `user` was granted, or one of their groups was."""
    permission = send_as_permission()
    mine = UserObjectPermission.objects.filter(user=user, permission=permission)
    ours = GroupObjectPermission.objects.filter(group__user=user, permission=permission)
    keys = [*mine.values_list("object_pk", flat=True), *ours.values_list("object_pk", flat=True)]
    return {int(key) for key in keys if key.isdigit()}


def senders_for(user) -> QuerySet[Client]:
    """The active sender clients `user` may send as: granted for each (to the user or
    one of their groups), or for every sender."""
    senders = Client.objects.filter(can_send=True, is_active=True).order_by("name")
    if not user.has_perm(SEND):
        return senders.none()
    if user.has_perm(SEND_AS):
        return senders
    return senders.filter(pk__in=granted_sender_ids(user))


def send_templates() -> list[SendTemplate]:
    """The ready-made sends the Send page offers, as they were first saved, each with
    its sender."""
    return list(SendTemplate.objects.select_related("sender").order_by("id"))


def sending_holders(client: Client) -> list[str]:
    """Who may send as `client` by a grant for it: "group:NAME" and "user:NAME"."""
    rows = {"permission": send_as_permission(), "object_pk": str(client.pk)}
    groups = GroupObjectPermission.objects.filter(**rows).values_list("group__name", flat=True)
    users = UserObjectPermission.objects.filter(**rows).values_list("user__username", flat=True)
    return sorted([*(f"group:{name}" for name in groups), *(f"user:{name}" for name in users)])


MAX_SENDING_CANDIDATES = 500


def sending_candidates() -> list[str]:
    """Whom sending as a client can be granted to: every group (role), then users."""
    groups = Group.objects.order_by("name").values_list("name", flat=True)
    users = get_user_model().objects.filter(is_active=True).order_by("username")
    usernames = users.values_list("username", flat=True)[:MAX_SENDING_CANDIDATES]
    return [f"group:{name}" for name in groups] + [f"user:{name}" for name in usernames]


def sending_holder(text: str):
    """The group or user "group:NAME" / "user:NAME" names (as sending_holders and
    sending_candidates write them), or None."""
    kind, _, name = text.partition(":")
    if kind == "group":
        return Group.objects.filter(name=name).first()
    if kind == "user":
        return get_user_model().objects.filter(username=name, is_active=True).first()
    return None
