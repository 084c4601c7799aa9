"""Which models a client that can receive (or send) uses: ClientModel.has_receivers and
has_senders, set by a trigger on every write of clients.

The vocabulary (broker/vocabulary.py) types selectors by the models of receivers and
policies by those of senders, and a process reads it again when its stamp moves. The
stamp took the largest client id for "a client was added"; but a transaction that took
its id before another's and committed after it moved nothing, and a process that had
read the vocabulary in between kept it without that client's model. These two flags
move when a model first counts, whoever wrote the client and in whatever order.

A trigger, as for the attribute history: clients are written by the services, by the
bulk loader (COPY) and by whatever comes next. One statement each, however many rows."""

from django.db import migrations, models

CREATE_TRIGGERS = """
CREATE FUNCTION broker_client_models_in_use() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE broker_clientmodel SET has_receivers = true
    WHERE NOT has_receivers AND id IN (SELECT model_id FROM written WHERE can_receive);
    UPDATE broker_clientmodel SET has_senders = true
    WHERE NOT has_senders AND id IN (SELECT model_id FROM written WHERE can_send);
    RETURN NULL;
END $$;

CREATE TRIGGER client_models_in_use_on_insert AFTER INSERT ON broker_client
REFERENCING NEW TABLE AS written
FOR EACH STATEMENT EXECUTE FUNCTION broker_client_models_in_use();

-- Clients are seldom updated, and these columns almost never: a row trigger on them.
CREATE FUNCTION broker_client_model_in_use() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE broker_clientmodel
    SET has_receivers = has_receivers OR NEW.can_receive,
        has_senders = has_senders OR NEW.can_send
    WHERE id = NEW.model_id
      AND ((NEW.can_receive AND NOT has_receivers) OR (NEW.can_send AND NOT has_senders));
    RETURN NULL;
END $$;

CREATE TRIGGER client_model_in_use_on_update
AFTER UPDATE OF can_send, can_receive, model_id ON broker_client
FOR EACH ROW EXECUTE FUNCTION broker_client_model_in_use();
"""

DROP_TRIGGERS = """
DROP TRIGGER client_model_in_use_on_update ON broker_client;
DROP TRIGGER client_models_in_use_on_insert ON broker_client;
DROP FUNCTION broker_client_model_in_use();
DROP FUNCTION broker_client_models_in_use();
"""

BACKFILL = """
UPDATE broker_clientmodel AS m SET
    has_receivers = EXISTS (SELECT 1 FROM broker_client c WHERE c.model_id = m.id AND c.can_receive),
    has_senders = EXISTS (SELECT 1 FROM broker_client c WHERE c.model_id = m.id AND c.can_send);
"""


class Migration(migrations.Migration):
    dependencies = [
        ("broker", "0018_summary_versions_kept"),
    ]

    operations = [
        migrations.AddField(
            model_name="clientmodel",
            name="has_receivers",
            field=models.BooleanField(db_default=False, default=False, editable=False),
        ),
        migrations.AddField(
            model_name="clientmodel",
            name="has_senders",
            field=models.BooleanField(db_default=False, default=False, editable=False),
        ),
        migrations.RunSQL(BACKFILL, reverse_sql=migrations.RunSQL.noop),
        migrations.RunSQL(CREATE_TRIGGERS, reverse_sql=DROP_TRIGGERS),
    ]
