"""The event service's records. PostgreSQL is the source of truth; the dispatcher
tree's memory is rebuilt from these tables.

Writes go through `broker.services`; nothing here holds business logic.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.core.validators import RegexValidator
from django.db import models
from django.db.models import Q
from django.db.models.expressions import RawSQL

from policies.types import ATTRIBUTE_TYPE_CHOICES

# The id of the transaction that wrote a row: PostgreSQL's own, so that a reader can
# track the snapshot's xmin (below which every transaction has ended) instead of ids
# or clocks, which become visible out of order.
CURRENT_TXID = RawSQL("pg_current_xact_id()::text::bigint", [])


def last_writer_txid() -> models.BigIntegerField:
    """A `txid` column: the transaction that last wrote the row. Set on insert by its
    default and on update by a trigger (migration 0015), whoever writes; the reports'
    export reads the rows written since its watermark by it (docs/reports.md)."""
    return models.BigIntegerField(db_default=CURRENT_TXID, db_index=True, editable=False)


identifier = RegexValidator(
    r"^[A-Za-z_][A-Za-z0-9_]*$", "Use letters, digits and underscores, starting with a letter."
)


class ClientModel(models.Model):
    """A client's *model*: the typed attributes it advertises (its address)."""

    name = models.SlugField(max_length=64, unique=True)
    description = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # Whether some client of this model can receive, or send: set by a trigger on every
    # write of clients (migration 0019), never unset (clients are never deleted). The
    # vocabulary's roles come from these (broker/vocabulary.py).
    has_receivers = models.BooleanField(default=False, db_default=False, editable=False)
    has_senders = models.BooleanField(default=False, db_default=False, editable=False)

    def __str__(self) -> str:
        return self.name


class ModelAttribute(models.Model):
    """One typed attribute of a model, and who may set it.

    `self_stated` attributes may be stated by the client itself; the others only by an
    authority the client granted permission to (region, trust, organisation...). A name
    has one type across all models (docs/addressing.md): creating a model refuses a
    name another model declares with another type.
    """

    model = models.ForeignKey(ClientModel, on_delete=models.CASCADE, related_name="attributes")
    name = models.CharField(max_length=64, validators=[identifier])
    type = models.CharField(max_length=8, choices=ATTRIBUTE_TYPE_CHOICES)
    self_stated = models.BooleanField(default=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["model", "name"], name="unique_attribute_per_model")
        ]
        ordering = ["model_id", "name"]

    def __str__(self) -> str:
        return f"{self.model.name}.{self.name}:{self.type}"


class EventAttribute(models.Model):
    """A declared attribute of event content: the type policies (`event.x`) and
    published content are checked against. Undeclared names may still be published,
    but no policy can test them. A declared type never changes."""

    name = models.CharField(max_length=64, unique=True, validators=[identifier])
    type = models.CharField(max_length=8, choices=ATTRIBUTE_TYPE_CHOICES)
    description = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return f"event.{self.name}:{self.type}"


class Dispatcher(models.Model):
    """A node of the dispatcher tree; clients attach to leaves."""

    name = models.CharField(max_length=64, unique=True)
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.PROTECT, related_name="children"
    )
    depth = models.PositiveSmallIntegerField()
    is_leaf = models.BooleanField()

    class Meta:
        ordering = ["depth", "id"]

    def __str__(self) -> str:
        return self.name

    @property
    def queue(self) -> str:
        """The Celery queue this dispatcher's work is routed to."""
        return f"dispatcher.{self.name}"


class Client(models.Model):
    """A sender, a receiver, or both, with its credentials and model."""

    name = models.SlugField(max_length=128, unique=True)
    model = models.ForeignKey(ClientModel, on_delete=models.PROTECT, related_name="clients")
    can_send = models.BooleanField(default=False)
    can_receive = models.BooleanField(default=True)
    secret_hash = models.CharField(max_length=256)
    dispatcher = models.ForeignKey(
        Dispatcher, null=True, blank=True, on_delete=models.PROTECT, related_name="clients"
    )
    is_active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # The public half of the key the client signs its events with (`ed25519:BASE64`,
    # sn_agent.signatures); authorities' signed attestations bind it. Empty: unsigned.
    signing_key = models.CharField(max_length=64, blank=True, default="", db_default="")

    class Meta:
        permissions = [
            # Held per sender client (django-guardian) by the users and groups that
            # may send as it from the console; held globally, as any sender.
            ("send_as_client", "Can send events as this client"),
            ("delegate_sending", "Can decide who may send as a client"),
        ]

    def __str__(self) -> str:
        return self.name


class ClientToken(models.Model):
    """A revocable bearer token a client got by logging in with its secret."""

    client = models.ForeignKey(Client, on_delete=models.CASCADE, related_name="tokens")
    key_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # CLIENT_TOKEN_DAYS after it was issued (broker.credentials.token_expiry).
    expires_at = models.DateTimeField()
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"token of {self.client_id} ({'revoked' if self.revoked_at else 'live'})"


class Authority(models.Model):
    """A third-party qualifier (inventory, trust manager) that attests attributes."""

    name = models.SlugField(max_length=128, unique=True)
    display_name = models.CharField(max_length=200)
    key_hash = models.CharField(max_length=64, unique=True)
    capabilities = models.ManyToManyField(ModelAttribute, related_name="authorities", blank=True)
    # The public half of the key its attestations are signed with (`ed25519:BASE64`), by
    # the console (SIGNING_KEYS_DIR) or by the authority's own tooling. Empty: unsigned.
    signing_key = models.CharField(max_length=64, blank=True, default="", db_default="")
    is_active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name_plural = "authorities"

    def __str__(self) -> str:
        return self.display_name


class AttestationGrant(models.Model):
    """A client's revocable permission for an authority to set its attributes."""

    client = models.ForeignKey(Client, on_delete=models.CASCADE, related_name="grants")
    authority = models.ForeignKey(Authority, on_delete=models.CASCADE, related_name="grants")
    key_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"grant {self.client_id} -> {self.authority_id}"


class AttributeValue(models.Model):
    """A client's current value of one attribute, with its provenance."""

    class Source(models.TextChoices):
        CLIENT = "client", "stated by the client"
        AUTHORITY = "authority", "attested by an authority"

    client = models.ForeignKey(Client, on_delete=models.CASCADE, related_name="attribute_values")
    name = models.CharField(max_length=64)
    value = models.JSONField()
    source = models.CharField(max_length=16, choices=Source.choices)
    authority = models.ForeignKey(Authority, null=True, blank=True, on_delete=models.PROTECT)
    set_at = models.DateTimeField()
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_by = models.CharField(max_length=200, blank=True, db_default="")  # an audit actor
    # The authority's signed attestation of this value for the client's signing key
    # (sn_agent.signatures.attestation_body and its signature); null: not signed.
    seal = models.JSONField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["client", "name"], name="one_value_per_attribute"),
            models.CheckConstraint(
                condition=Q(source="client", authority__isnull=True)
                | Q(source="authority", authority__isnull=False),
                name="authority_iff_attested",
            ),
        ]
        indexes = [
            # Finds the values that expired since the last look (broker.expire_attributes).
            models.Index(
                fields=["expires_at"],
                condition=Q(expires_at__isnull=False),
                name="expiring_attribute_value",
            ),
            # One attribute of many clients (the event page's deliveries by region)
            # without reading every client's other attributes.
            models.Index(fields=["name", "client"], include=["value"], name="attribute_by_name"),
        ]

    def __str__(self) -> str:
        return f"{self.name}={self.value!r} ({self.source})"


class AttributeHistory(models.Model):
    """Every value a client's attribute took, and when it was renewed or revoked: what
    "its attributes as they were" at a past moment reads (broker.reads.history.attributes_as_of).

    Written only by a trigger on AttributeValue (migration 0010), never by Python: the
    services, the bulk COPY loader and anything written later all change values, and a
    trigger is the one place none of them can forget. A row takes effect at `at`: the
    value's `set_at` for SET, the renewal's moment for RENEWED (only `expires_at`
    moved), `revoked_at` for REVOKED (the value that was revoked is kept).

    Partitioned by the day of `at` (migration 0029) and kept RETAIN_DAYS_ATTRIBUTES
    days: the values standing at the first day kept are carried into it, so a read as
    of any moment from then on finds what it found before (docs/operations.md).
    """

    class Kind(models.TextChoices):
        SET = "set", "set"
        RENEWED = "renewed", "renewed"
        REVOKED = "revoked", "revoked"

    # No constraints and no indexes of their own on the keys: the trigger copies them
    # from rows that hold them already, and checking each again at commit made a bulk
    # load a third slower; (client, name, at) serves the reads.
    client = models.ForeignKey(
        Client, on_delete=models.CASCADE, related_name="+", db_constraint=False, db_index=False
    )
    name = models.CharField(max_length=64)
    kind = models.CharField(max_length=8, choices=Kind.choices)
    value = models.JSONField()
    source = models.CharField(max_length=16, choices=AttributeValue.Source.choices)
    authority = models.ForeignKey(
        Authority,
        null=True,
        blank=True,
        on_delete=models.DO_NOTHING,  # authorities are disabled, never deleted
        related_name="+",
        db_constraint=False,
        db_index=False,
    )
    set_at = models.DateTimeField()
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_by = models.CharField(max_length=200, blank=True, db_default="")
    at = models.DateTimeField()
    # Set on a copy retention made of a value standing at the first day it keeps,
    # before dropping the days before (lifecycle.retention.carry_forward): the original
    # row's `at`, while the copy takes effect from the first day kept. Not exported: the
    # reports' dataset holds the original.
    carried_from = models.DateTimeField(null=True, blank=True)
    txid = last_writer_txid()

    class Meta:
        indexes = [
            models.Index(fields=["client", "name", "at"], name="attribute_history_at"),
            # Where the history kept starts (broker.reads.history.history_kept_from).
            models.Index(
                fields=["at"], condition=Q(carried_from__isnull=False), name="attribute_carried"
            ),
        ]
        verbose_name_plural = "attribute history"

    def __str__(self) -> str:
        return f"{self.client_id}.{self.name} {self.kind} at {self.at:%Y-%m-%d %H:%M:%S}"

    @property
    def happened_at(self):
        """When the change this row records happened (a carried copy's original)."""
        return self.carried_from or self.at


class AgentPresence(models.Model):
    """Whether and when a client's agent is connected: one row per client that ever
    logged in, written by the agent socket (broker.services.presence).

    `sessions` counts open sockets (an agent may hold several with its tokens). A web
    process that is killed never closes its sessions, so the count alone does not say
    "connected": broker.reads.presence.is_connected also wants a recent `last_seen_at`.
    """

    client = models.OneToOneField(
        Client, on_delete=models.CASCADE, primary_key=True, related_name="presence"
    )
    sessions = models.PositiveIntegerField(default=0)
    connected_since = models.DateTimeField(null=True, blank=True)  # null: no session open
    last_seen_at = models.DateTimeField()
    last_peer = models.CharField(max_length=64, blank=True, default="")  # host:port
    # What the agent said of itself at its last login (broker.protocol.AgentSelf): its
    # software, and what it acts on (signed events, anything, nothing; "": unknown).
    agent_software = models.CharField(max_length=64, blank=True, default="", db_default="")
    acts_on = models.CharField(max_length=16, blank=True, default="", db_default="")
    # Any write moves it, so that a reader can fetch the rows changed since a moment.
    updated_at = models.DateTimeField(db_index=True)

    class Meta:
        verbose_name_plural = "agent presences"

    def __str__(self) -> str:
        return f"presence of {self.client_id}: {self.sessions} session(s)"


class PolicyVersion(models.Model):
    """One version of a receiver's connectivity policy; the highest is current."""

    client = models.ForeignKey(Client, on_delete=models.CASCADE, related_name="policy_versions")
    version = models.PositiveIntegerField()
    text = models.TextField()
    canonical_text = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True)
    created_by = models.CharField(max_length=200)
    txid = last_writer_txid()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["client", "version"], name="unique_policy_version")
        ]
        ordering = ["client_id", "-version"]

    def __str__(self) -> str:
        return f"policy v{self.version} of {self.client_id}"


class ChannelCursor(models.Model):
    """The last sequence number a sender used on a channel."""

    sender = models.ForeignKey(Client, on_delete=models.CASCADE, related_name="channel_cursors")
    channel = models.CharField(max_length=128)
    last_sequence = models.PositiveBigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["sender", "channel"], name="one_cursor_per_channel")
        ]

    def __str__(self) -> str:
        return f"{self.sender_id}/{self.channel}@{self.last_sequence}"


class Event(models.Model):
    """A published event: content, optional selector, and the sender's attested
    attributes as they were at publish time (never taken from the content)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    sender = models.ForeignKey(Client, on_delete=models.PROTECT, related_name="events_sent")
    channel = models.CharField(max_length=128)
    sequence = models.PositiveBigIntegerField()
    content = models.JSONField()
    selector = models.TextField(blank=True)
    sender_attributes = models.JSONField()
    lifetime_s = models.PositiveIntegerField()
    published_at = models.DateTimeField()
    expires_at = models.DateTimeField(db_index=True)
    routed_at = models.DateTimeField(null=True, blank=True)
    # Chosen by the sender so that a retried publish returns this event instead of
    # publishing it twice (the first answer may have been lost after the commit).
    idempotency_key = models.CharField(max_length=128, blank=True, default="")
    # Who published it: the sender's own agent, or an operator acting for it (an
    # audit actor, "client:NAME" or "user:NAME").
    sent_by = models.CharField(max_length=200, blank=True, db_default="")
    # A resend to the receivers that did not answer an earlier event: only these
    # clients may receive it (and only if its selector and their policies agree).
    resend_of = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="resends"
    )
    recipients = ArrayField(models.BigIntegerField(), null=True, blank=True)
    # The sender's signature and the signed attestations of its attributes, as agents
    # verify them (sn_agent.signatures.SEAL_FIELDS); null: the event is not signed.
    seal = models.JSONField(null=True, blank=True)
    txid = last_writer_txid()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["sender", "channel", "sequence"], name="unique_sequence_per_channel"
            ),
            models.UniqueConstraint(
                fields=["sender", "idempotency_key"],
                condition=~Q(idempotency_key=""),
                name="one_event_per_idempotency_key",
            ),
        ]
        indexes = [
            # The console lists events newest first, a page at a time.
            models.Index(fields=["-published_at"], name="event_newest"),
            # The sweep looks for events whose first hop was lost (few, and recent).
            models.Index(
                fields=["published_at"], condition=Q(routed_at=None), name="event_unrouted"
            ),
        ]

    def __str__(self) -> str:
        return f"event {self.sender_id}/{self.channel}#{self.sequence}"


class ArchivedEvent(models.Model):
    """An event whose deliveries retention dropped (lifecycle.retention): what they came
    to, by state, region and dispatcher, as its page counted them
    (broker.reads.progress), so that its page, the events list and the API still show
    them, and say where each receiver's fate still is (the reports' dataset)."""

    event = models.OneToOneField(
        Event, on_delete=models.CASCADE, primary_key=True, related_name="archive"
    )
    archived_at = models.DateTimeField()
    # [[state, region, dispatcher, count], ...]: the rows broker.reads.progress counts.
    counts = models.JSONField()

    def __str__(self) -> str:
        return f"archive of {self.event_id}"


class SendTemplate(models.Model):
    """A ready-made send the console's Send page offers (`?template=SLUG`): the event
    to start from, checked as publishing checks one when it was saved. Saved by
    `broker.services.sending.save_send_template` (the demo's scenario saves its own)."""

    slug = models.SlugField(max_length=64, unique=True)
    title = models.CharField(max_length=200)
    sender = models.ForeignKey(Client, on_delete=models.CASCADE, related_name="send_templates")
    content = models.JSONField()
    selector = models.TextField(blank=True)
    lifetime_s = models.PositiveIntegerField()
    channel = models.CharField(max_length=128)
    saved_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["id"]  # as they were first saved

    def __str__(self) -> str:
        return f"send template {self.slug}"


class Delivery(models.Model):
    """One event delivered to one receiver, and what became of it.

    `pending`: recorded for the receiver, not yet confirmed by its agent;
    `delivered`: the agent confirmed it has it; `acked` / `failed`: the agent answered;
    `expired`: the event's lifetime ended before the agent confirmed it.
    """

    # A delivery whose event expired longer ago than this is final: no confirmation,
    # answer, expiry or leaf reads it again, so that those read the partitions from
    # then on only. Events live at most 7 days (broker.services.events.MAX_LIFETIME_S),
    # so every event published since then expires within it.
    FINAL_AFTER_DAYS = 8
    FINAL_AFTER_SQL = f"now() - interval '{FINAL_AFTER_DAYS} days'"

    class State(models.TextChoices):
        PENDING = "pending"
        DELIVERED = "delivered"
        ACKED = "acked"
        FAILED = "failed"
        EXPIRED = "expired"

    # No index of their own: every lookup by event or receiver starts an index below
    # (one_delivery_per_receiver, the receiver's indexes), and the leaf inserts rows
    # for every hop, each row into every index. Lookups by sender alone there are none;
    # an index on it let the planner, on a table without statistics yet (a new
    # installation's first minute), look up a receiver's position through every
    # delivery of the sender.
    event = models.ForeignKey(
        Event, on_delete=models.CASCADE, related_name="deliveries", db_index=False
    )
    receiver = models.ForeignKey(
        Client, on_delete=models.CASCADE, related_name="deliveries", db_index=False
    )
    # Copied from the event so that a receiver's position in each channel is one
    # indexed query: deliveries reach a receiver in sequence order, per sender and channel.
    sender = models.ForeignKey(Client, on_delete=models.CASCADE, related_name="+", db_index=False)
    channel = models.CharField(max_length=128)
    sequence = models.PositiveBigIntegerField()
    # The receiver's own numbering of its deliveries: 1, 2, 3... without gaps, in
    # commit order. Agents confirm, resume and detect gaps by it (docs/protocol.md).
    position = models.PositiveBigIntegerField()
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    # The event's expiry, copied: the table is partitioned by its day (migration 0026),
    # so that every delivery of an event is in one partition, those of live events in
    # the few from today on, and a day past retention is dropped whole. A query about
    # one event names it, and one about live deliveries bounds it, so that PostgreSQL
    # reads those partitions only.
    expires_at = models.DateTimeField()
    delivered_at = models.DateTimeField()  # when it was recorded for the receiver
    received_at = models.DateTimeField(null=True, blank=True)  # confirmed by the agent
    acked_at = models.DateTimeField(null=True, blank=True)
    result = models.JSONField(null=True, blank=True)
    txid = last_writer_txid()

    class Meta:
        constraints = [
            # With the partitioning key: PostgreSQL enforces uniqueness per partition,
            # and an event's deliveries share one. Positions are unique by the stream's
            # counter (ReceiverStream), which hands each out once.
            models.UniqueConstraint(
                fields=["event", "receiver", "expires_at"], name="one_delivery_per_receiver"
            ),
            models.UniqueConstraint(
                fields=["receiver", "position", "expires_at"], name="one_delivery_per_position"
            ),
        ]
        indexes = [
            models.Index(fields=["receiver", "delivered_at"]),
            models.Index(fields=["receiver", "sender", "channel", "sequence"]),
            # Finds what is still unconfirmed when events expire.
            models.Index(
                fields=["event"], condition=Q(state="pending"), name="pending_delivery_event"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.event_id} -> {self.receiver_id} ({self.state})"


class ReceiverStream(models.Model):
    """A receiver's stream of deliveries: the last position handed out, and the last
    position its agent confirmed having (every position up to it is confirmed)."""

    client = models.OneToOneField(
        Client, on_delete=models.CASCADE, primary_key=True, related_name="stream"
    )
    last_position = models.PositiveBigIntegerField(default=0)
    confirmed_position = models.PositiveBigIntegerField(default=0)

    def __str__(self) -> str:
        return f"stream of {self.client_id}: {self.confirmed_position}/{self.last_position}"


class TrafficRecord(models.Model):
    """One hop of an event through a dispatcher."""

    class Direction(models.TextChoices):
        UP = "up"
        DOWN = "down"

    event = models.ForeignKey(Event, on_delete=models.CASCADE, related_name="hops")
    dispatcher = models.ForeignKey(Dispatcher, on_delete=models.CASCADE, related_name="hops")
    direction = models.CharField(max_length=8, choices=Direction.choices)
    forwarded_to = models.JSONField(default=list)
    delivered = models.PositiveIntegerField(default=0)
    # 1 when the event came down here and went nowhere: this dispatcher's summary let
    # it in, but no child and no receiver below took it.
    wasted = models.PositiveIntegerField(default=0)
    at = models.DateTimeField()
    txid = last_writer_txid()

    class Meta:
        indexes = [
            # The console's tree page reads the last minute of every dispatcher's hops.
            models.Index(fields=["at"], name="traffic_at"),
        ]

    def __str__(self) -> str:
        return f"{self.event_id} at {self.dispatcher_id} ({self.direction})"


class OperatorToken(models.Model):
    """A revocable bearer token with which an operator's integration (a SOAR tool, a
    script) uses the HTTP API with that operator's permissions."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    label = models.CharField(max_length=100)
    key_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # OPERATOR_TOKEN_DAYS after it was issued (broker.credentials.token_expiry).
    expires_at = models.DateTimeField()
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.label} of {self.user_id} ({'revoked' if self.revoked_at else 'live'})"


class AuditEntry(models.Model):
    """Every change and every refusal, with who did it and why."""

    class Outcome(models.TextChoices):
        DONE = "done"
        REFUSED = "refused"

    at = models.DateTimeField()
    # Compared byte by byte ("C"): names sort and match by prefix (`user:*`, `event.*`)
    # through the indexes below, whatever the database's locale.
    actor = models.CharField(max_length=200, db_collation="C")
    action = models.CharField(max_length=64, db_collation="C")
    target = models.CharField(max_length=200, blank=True, db_collation="C")
    outcome = models.CharField(max_length=16, choices=Outcome.choices)
    reason = models.TextField(blank=True)
    details = models.JSONField(default=dict)
    txid = last_writer_txid()
    # The entry's authentication code (broker.audit.authentication_code), made by the
    # console as it writes the entry: empty on entries written before codes were kept.
    mac = models.CharField(max_length=64, blank=True, db_default="", editable=False)

    class Meta:
        ordering = ["-at", "-id"]
        verbose_name_plural = "audit entries"
        # The audit log page filters by each of these and shows the newest first, a
        # page at a time from where the last one ended (broker.reads.audit).
        indexes = [
            models.Index(fields=["-at", "-id"], name="audit_newest"),
            models.Index(fields=["actor", "-at", "-id"], name="audit_by_actor"),
            models.Index(fields=["action", "-at", "-id"], name="audit_by_action"),
            models.Index(fields=["target", "-at", "-id"], name="audit_by_target"),
        ]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.actor} {self.action} {self.outcome}"


class ClientChange(models.Model):
    """A change to a client that its leaf dispatcher must apply (attributes, policy,
    registration, deactivation). Leaves read this log in id order to refresh their
    in-memory matcher, so no change is ever missed by a worker that was busy or down."""

    # The log is partitioned by day and only its last KEPT_DAYS days are kept
    # (lifecycle.retention): a reader that has not read it for STALE_AFTER_S may have
    # missed what was dropped, and builds what it holds from the clients instead.
    KEPT_DAYS = 2
    STALE_AFTER_S = 24 * 3600
    # `at` is the writer's clock at the write: a reader asks for the changes written
    # from this long before its last read on (a transaction that ran long, a host's
    # clock behind), which keeps its read to the newest day's partitions.
    READ_OVERLAP = timedelta(hours=1)

    client = models.ForeignKey(Client, on_delete=models.CASCADE, related_name="changes")
    dispatcher = models.ForeignKey(Dispatcher, on_delete=models.CASCADE, related_name="changes")
    # The writing transaction's id. Ids of rows are handed out before commit, so a row
    # with a smaller id can become visible after a larger one; readers instead track
    # PostgreSQL's snapshot xmin, below which every transaction has ended.
    txid = models.BigIntegerField(db_default=CURRENT_TXID)
    at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["dispatcher", "txid"])]

    def __str__(self) -> str:
        return f"change of {self.client_id} at {self.dispatcher_id}"


class DispatcherSummary(models.Model):
    """What a dispatcher's subtree accepts and looks like (see broker.dispatch.summary).

    It may over-approximate, never under-approximate; `version` grows on every save so
    that workers know when their cached copy is stale.
    """

    dispatcher = models.OneToOneField(
        Dispatcher, on_delete=models.CASCADE, related_name="summary", primary_key=True
    )
    version = models.PositiveBigIntegerField(default=0)
    data = models.JSONField()
    updated_at = models.DateTimeField(auto_now=True)
    # What the policy of `data` costs and what coagulation lost to reach it
    # (Summary.figures), kept so that the console need not parse every summary. Null
    # until the summary is next computed, for summaries stored before they were kept.
    filters = models.PositiveIntegerField(null=True, blank=True)
    constraints = models.PositiveIntegerField(null=True, blank=True)
    exact_filters = models.PositiveIntegerField(null=True, blank=True)  # before coagulation
    # Coagulation loss, on recent events when the summary was computed: of
    # `loss_sampled` events, `loss_extra` were accepted by the summary's policy and by
    # none of the exact filters it replaced.
    loss_sampled = models.PositiveIntegerField(default=0)
    loss_extra = models.PositiveIntegerField(default=0)

    def __str__(self) -> str:
        return f"summary of {self.dispatcher_id} v{self.version}"


class SummaryVersion(models.Model):
    """A dispatcher's summary as stored at one version, kept for the last
    `SummaryVersion.KEPT` versions: a parent resending what a child's growth may concern
    compares the version that grew with the one before it, however many versions the
    child has stored since (a burst of changes stores dozens in a second)."""

    KEPT = 64

    dispatcher = models.ForeignKey(
        Dispatcher, on_delete=models.CASCADE, related_name="summary_versions", db_index=False
    )
    version = models.PositiveBigIntegerField()
    data = models.JSONField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["dispatcher", "version"], name="summary_version_once_per_dispatcher"
            )
        ]

    def __str__(self) -> str:
        return f"summary of {self.dispatcher_id} as of v{self.version}"


class TrafficWatermark(models.Model):
    """How far the traffic log in Redis has been moved into `TrafficRecord`
    (broker/dispatch/traffic.py): the last stream entry moved. One row."""

    last_entry = models.CharField(max_length=40, blank=True, default="")

    def __str__(self) -> str:
        return f"traffic moved through {self.last_entry or 'nothing'}"
