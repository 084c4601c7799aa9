# The delivery contract of docs/protocol.md: per-receiver positions, receipt
# confirmation, the pending and expired states, and publish idempotency keys.

import django.db.models.deletion
from django.db import migrations, models

# Deliveries recorded before positions existed are numbered in id order, which is the
# order their leaf committed them.
NUMBER_EXISTING = """
UPDATE broker_delivery AS d SET position = numbered.position
FROM (
    SELECT id, row_number() OVER (PARTITION BY receiver_id ORDER BY id) AS position
    FROM broker_delivery
) AS numbered
WHERE d.id = numbered.id
"""

# They were pushed under the earlier contract, which had no confirmation: count them as
# confirmed, rather than send every agent its whole history again.
OPEN_STREAMS = """
INSERT INTO broker_receiverstream (client_id, last_position, confirmed_position)
SELECT receiver_id, max(position), max(position) FROM broker_delivery GROUP BY receiver_id
"""


class Migration(migrations.Migration):
    dependencies = [
        ("broker", "0004_operator_token"),
    ]

    operations = [
        migrations.AddField(
            model_name="event",
            name="idempotency_key",
            field=models.CharField(blank=True, default="", max_length=128),
        ),
        migrations.AddConstraint(
            model_name="event",
            constraint=models.UniqueConstraint(
                condition=models.Q(("idempotency_key", ""), _negated=True),
                fields=("sender", "idempotency_key"),
                name="one_event_per_idempotency_key",
            ),
        ),
        migrations.AddField(
            model_name="delivery",
            name="position",
            field=models.PositiveBigIntegerField(null=True),
        ),
        migrations.AddField(
            model_name="delivery",
            name="received_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AlterField(
            model_name="delivery",
            name="state",
            field=models.CharField(
                choices=[
                    ("pending", "Pending"),
                    ("delivered", "Delivered"),
                    ("acked", "Acked"),
                    ("failed", "Failed"),
                    ("expired", "Expired"),
                ],
                default="pending",
                max_length=16,
            ),
        ),
        migrations.RunSQL(NUMBER_EXISTING, migrations.RunSQL.noop),
        migrations.AlterField(
            model_name="delivery",
            name="position",
            field=models.PositiveBigIntegerField(),
        ),
        migrations.AddConstraint(
            model_name="delivery",
            constraint=models.UniqueConstraint(
                fields=("receiver", "position"), name="one_delivery_per_position"
            ),
        ),
        migrations.AddIndex(
            model_name="delivery",
            index=models.Index(
                condition=models.Q(state="pending"),
                fields=["event"],
                name="pending_delivery_event",
            ),
        ),
        migrations.CreateModel(
            name="ReceiverStream",
            fields=[
                (
                    "client",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        primary_key=True,
                        related_name="stream",
                        serialize=False,
                        to="broker.client",
                    ),
                ),
                ("last_position", models.PositiveBigIntegerField(default=0)),
                ("confirmed_position", models.PositiveBigIntegerField(default=0)),
            ],
        ),
        migrations.RunSQL(OPEN_STREAMS, migrations.RunSQL.noop),
    ]
