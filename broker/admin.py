"""The project's records in Django's admin, read-only, for support staff.

The console's pages are the working surface; every change goes through
`broker.services` (validated and audited), so nothing here can add, change or delete.
Hashes of secrets are not shown. Lists join what they display (no query per row) and
skip the exact count on the large tables.
"""

from __future__ import annotations

from django.contrib import admin

from broker import models


class ReadOnlyAdmin(admin.ModelAdmin):
    """Lists and detail pages only: no add, change or delete, for anyone."""

    list_per_page = 100
    show_full_result_count = False

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


@admin.register(models.ClientModel)
class ClientModelAdmin(ReadOnlyAdmin):
    list_display = ("name", "description", "created_at")
    search_fields = ("name", "description")


@admin.register(models.ModelAttribute)
class ModelAttributeAdmin(ReadOnlyAdmin):
    list_display = ("name", "model", "type", "self_stated")
    list_filter = ("type", "self_stated", "model")
    list_select_related = ("model",)
    search_fields = ("name", "model__name")


@admin.register(models.EventAttribute)
class EventAttributeAdmin(ReadOnlyAdmin):
    list_display = ("name", "type", "description", "created_at")
    list_filter = ("type",)
    search_fields = ("name", "description")


@admin.register(models.Dispatcher)
class DispatcherAdmin(ReadOnlyAdmin):
    list_display = ("name", "parent", "depth", "is_leaf", "queue")
    list_filter = ("depth", "is_leaf")
    list_select_related = ("parent",)
    search_fields = ("name",)


@admin.register(models.Client)
class ClientAdmin(ReadOnlyAdmin):
    list_display = (
        "name", "model", "can_send", "can_receive", "is_active", "dispatcher", "created_at",
    )  # fmt: skip
    list_filter = ("is_active", "can_send", "can_receive", "model")
    list_select_related = ("model", "dispatcher")
    search_fields = ("name",)
    exclude = ("secret_hash",)


@admin.register(models.ClientToken)
class ClientTokenAdmin(ReadOnlyAdmin):
    list_display = ("client", "created_at", "last_used_at", "revoked_at")
    list_filter = (("revoked_at", admin.EmptyFieldListFilter),)
    list_select_related = ("client",)
    search_fields = ("client__name",)
    exclude = ("key_hash",)


@admin.register(models.Authority)
class AuthorityAdmin(ReadOnlyAdmin):
    list_display = ("name", "display_name", "is_active", "created_at")
    list_filter = ("is_active",)
    search_fields = ("name", "display_name")
    exclude = ("key_hash",)


@admin.register(models.AttestationGrant)
class AttestationGrantAdmin(ReadOnlyAdmin):
    list_display = ("client", "authority", "created_at", "revoked_at")
    list_filter = ("authority", ("revoked_at", admin.EmptyFieldListFilter))
    list_select_related = ("client", "authority")
    search_fields = ("client__name", "authority__name")
    exclude = ("key_hash",)


@admin.register(models.AttributeValue)
class AttributeValueAdmin(ReadOnlyAdmin):
    list_display = (
        "client", "name", "value", "source", "authority", "set_at", "expires_at", "revoked_at",
    )  # fmt: skip
    list_filter = ("source", "authority", ("revoked_at", admin.EmptyFieldListFilter))
    list_select_related = ("client", "authority")
    search_fields = ("client__name", "name")


@admin.register(models.AttributeHistory)
class AttributeHistoryAdmin(ReadOnlyAdmin):
    list_display = (
        "client", "name", "kind", "value", "source", "authority", "set_at", "expires_at", "at",
    )  # fmt: skip
    list_filter = ("kind", "source", "authority")
    list_select_related = ("client", "authority")
    search_fields = ("client__name", "name")


@admin.register(models.PolicyVersion)
class PolicyVersionAdmin(ReadOnlyAdmin):
    list_display = ("client", "version", "created_by", "created_at")
    list_select_related = ("client",)
    search_fields = ("client__name", "text", "created_by")


@admin.register(models.ChannelCursor)
class ChannelCursorAdmin(ReadOnlyAdmin):
    list_display = ("sender", "channel", "last_sequence")
    list_select_related = ("sender",)
    search_fields = ("sender__name", "channel")


@admin.register(models.Event)
class EventAdmin(ReadOnlyAdmin):
    list_display = (
        "id", "sender", "channel", "sequence", "published_at", "expires_at", "routed_at",
    )  # fmt: skip
    list_filter = (("routed_at", admin.EmptyFieldListFilter),)
    list_select_related = ("sender",)
    search_fields = ("sender__name", "channel", "idempotency_key")
    date_hierarchy = "published_at"
    ordering = ("-published_at",)


@admin.register(models.ArchivedEvent)
class ArchivedEventAdmin(ReadOnlyAdmin):
    list_display = ("event", "archived_at")
    list_select_related = ("event__sender",)
    date_hierarchy = "archived_at"
    ordering = ("-archived_at",)


@admin.register(models.SendTemplate)
class SendTemplateAdmin(ReadOnlyAdmin):
    list_display = ("slug", "title", "sender", "channel", "saved_at")
    list_select_related = ("sender",)
    search_fields = ("slug", "title", "sender__name")


@admin.register(models.Delivery)
class DeliveryAdmin(ReadOnlyAdmin):
    list_display = (
        "event_id", "receiver", "sender", "channel", "sequence", "position", "state",
        "delivered_at", "acked_at",
    )  # fmt: skip
    list_filter = ("state",)
    list_select_related = ("receiver", "sender")
    search_fields = ("receiver__name", "sender__name", "channel")
    date_hierarchy = "delivered_at"
    ordering = ("-delivered_at", "-id")


@admin.register(models.ReceiverStream)
class ReceiverStreamAdmin(ReadOnlyAdmin):
    list_display = ("client", "last_position", "confirmed_position")
    list_select_related = ("client",)
    search_fields = ("client__name",)


@admin.register(models.AgentPresence)
class AgentPresenceAdmin(ReadOnlyAdmin):
    list_display = ("client", "sessions", "connected_since", "last_seen_at", "last_peer")
    list_select_related = ("client",)
    search_fields = ("client__name",)


@admin.register(models.TrafficRecord)
class TrafficRecordAdmin(ReadOnlyAdmin):
    list_display = (
        "event_id", "dispatcher", "direction", "forwarded_to", "delivered", "wasted", "at",
    )  # fmt: skip
    list_filter = ("direction", "dispatcher")
    list_select_related = ("dispatcher",)
    ordering = ("-at", "-id")


@admin.register(models.OperatorToken)
class OperatorTokenAdmin(ReadOnlyAdmin):
    list_display = ("label", "user", "created_at", "last_used_at", "revoked_at")
    list_filter = (("revoked_at", admin.EmptyFieldListFilter),)
    list_select_related = ("user",)
    search_fields = ("label", "user__username")
    exclude = ("key_hash",)


@admin.register(models.AuditEntry)
class AuditEntryAdmin(ReadOnlyAdmin):
    list_display = ("at", "actor", "action", "target", "outcome", "reason")
    list_filter = ("outcome", "action")
    search_fields = ("actor", "action", "target", "reason")
    date_hierarchy = "at"


@admin.register(models.ClientChange)
class ClientChangeAdmin(ReadOnlyAdmin):
    list_display = ("client", "dispatcher", "txid", "at")
    list_select_related = ("client", "dispatcher")
    search_fields = ("client__name",)
    ordering = ("-id",)


@admin.register(models.DispatcherSummary)
class DispatcherSummaryAdmin(ReadOnlyAdmin):
    list_display = ("dispatcher", "version", "updated_at")
    list_select_related = ("dispatcher",)


@admin.register(models.SummaryVersion)
class SummaryVersionAdmin(ReadOnlyAdmin):
    list_display = ("dispatcher", "version")
    list_select_related = ("dispatcher",)
    ordering = ("dispatcher", "-version")


@admin.register(models.TrafficWatermark)
class TrafficWatermarkAdmin(ReadOnlyAdmin):
    list_display = ("id", "last_entry")
