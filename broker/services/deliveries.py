"""What receivers do with their deliveries: confirm that they have them, acknowledge
them with results; and what becomes of those never confirmed before their event expired."""

from __future__ import annotations

import json
from typing import Any

from django.db import connection, transaction
from psycopg.types.json import Jsonb

from broker import announcements, audit
from broker.audit import Actor
from broker.credentials import key_digest
from broker.errors import InvalidInput, NotFound
from broker.models import AuditEntry, Client, ClientToken, Delivery, ReceiverStream
from broker.prepared import prepared_cursor
from broker.selectors import live_token_ids_sql

MAX_RESULT_BYTES = 16 * 1024
ACK_STATUSES = {"ok": Delivery.State.ACKED, "failed": Delivery.State.FAILED}


def acknowledge_delivery(
    *, client: Client, delivery_id: Any, status: Any, result: Any = None, actor: Actor
) -> None:
    """Record that `client` handled one of its deliveries, with the command's result.

    Acknowledging again with the same status changes nothing (agents retry after a
    reconnect); changing an answered delivery's status is refused.
    """
    target = f"client:{client.name}"
    with audit.refusals_recorded(actor=actor, action="delivery.ack", target=target):
        state = _checked_ack(delivery_id, status, result)
        found = _answer_unless_answered(client, delivery_id, state, result, actor)
        if found is None:
            # Another receiver's delivery is "not found": ids reveal nothing.
            raise NotFound(f"no delivery {delivery_id} for this client", field="delivery")
        old_state, same_result, event_id, answered = found
        if answered:
            transaction.on_commit(lambda: announcements.events_changed([event_id]), robust=True)
        elif old_state != state or not same_result:
            raise InvalidInput(
                f"delivery {delivery_id} was already answered ({old_state})",
                field="delivery",
            )


# The answer in one statement, audited in it: the delivery locked, answered unless it
# already was, and the change entry that audit.record_change would write; then its
# state before, whether its result was this one, and whether this answered it.
ANSWER_UNLESS_ANSWERED = """
WITH old AS (
    SELECT id, state, result, event_id FROM broker_delivery
    WHERE id = %(delivery)s AND receiver_id = %(receiver)s FOR UPDATE
),
answered AS (
    UPDATE broker_delivery AS d
    SET state = %(state)s, result = %(result)s, acked_at = now(),
        received_at = coalesce(d.received_at, now())
    FROM old WHERE d.id = old.id AND old.state NOT IN ('acked', 'failed')
    RETURNING d.id, d.event_id
),
audited AS (
    INSERT INTO broker_auditentry (at, actor, action, target, outcome, reason, details)
    SELECT now(), %(actor)s, 'delivery.ack', 'event:' || answered.event_id, %(done)s, '',
           jsonb_build_object('delivery', answered.id, 'state', %(state)s::text)
    FROM answered
)
SELECT old.state, old.result IS NOT DISTINCT FROM %(result)s::jsonb, old.event_id,
       EXISTS (SELECT FROM answered)
FROM old
"""


def _answer_unless_answered(
    client: Client, delivery_id: int, state: str, result: Any, actor: Actor
) -> tuple | None:
    params = {
        "delivery": delivery_id,
        "receiver": client.pk,
        "state": str(state),
        "result": None if result is None else Jsonb(result),  # no result: SQL NULL
        "actor": str(actor),
        "done": AuditEntry.Outcome.DONE.value,
    }
    with prepared_cursor() as cursor:  # one statement: its own transaction
        cursor.execute(ANSWER_UNLESS_ANSWERED, params)
        return cursor.fetchone()


def _checked_ack(delivery_id: Any, status: Any, result: Any) -> str:
    if isinstance(delivery_id, bool) or not isinstance(delivery_id, int):
        raise InvalidInput("delivery must be a delivery id (a whole number)", field="delivery")
    if status not in ACK_STATUSES:
        raise InvalidInput('status must be "ok" or "failed"', field="status")
    if result is not None and not isinstance(result, dict):
        raise InvalidInput("result must be an object", field="result")
    if len(json.dumps(result)) > MAX_RESULT_BYTES:
        raise InvalidInput(f"result is larger than {MAX_RESULT_BYTES} bytes", field="result")
    return ACK_STATUSES[status]


def confirm_receipt(*, client: Client, position: Any, actor: Actor) -> ReceiverStream:
    """The client's agent has every delivery up to `position` (its stream's numbering):
    they are `delivered`. Confirming less than before changes nothing. Returns the
    stream, whose `last_position` tells the agent whether it is missing some."""
    return _confirmed(client, position, actor, live=("SELECT 1", []))


def confirm_receipt_while_live(
    *, token: str, client: Client, position: Any, actor: Actor
) -> ReceiverStream | None:
    """`confirm_receipt` for a session: None, and nothing changed, if `token` no
    longer lets `client` in (selectors.live_tokens); else the stream, as there."""
    live = f"SELECT FROM {ClientToken._meta.db_table} WHERE id IN ({live_token_ids_sql()})"
    live_for_client = (f"{live} AND client_id = %s", [key_digest(token), client.pk])
    return _confirmed(client, position, actor, live=live_for_client)


# A confirmation in one statement: whether the client may confirm (`live`), the
# stream's end, the deliveries marked received (pending and expired ones: an agent that
# says it has a delivery has it, even if its event expired before it said so) and the
# stream's new confirmed position. That position only grows: the UPDATE checks it again
# on the row it locks. An idle agent confirming what it confirmed before changes nothing.
CONFIRM = """
WITH live AS ({live}),
stream AS (
    SELECT coalesce(max(last_position), 0) AS last_position,
           coalesce(max(confirmed_position), 0) AS confirmed_position
    FROM broker_receiverstream WHERE client_id = %s
),
marked AS (
    UPDATE broker_delivery AS d SET state = 'delivered', received_at = now()
    FROM stream
    WHERE EXISTS (SELECT FROM live) AND d.receiver_id = %s
      AND d.position > stream.confirmed_position AND d.position <= %s
      AND %s <= stream.last_position AND d.state IN ('pending', 'expired')
    RETURNING d.event_id
),
moved AS (
    UPDATE broker_receiverstream SET confirmed_position = %s
    WHERE EXISTS (SELECT FROM live) AND client_id = %s
      AND confirmed_position < %s AND %s <= last_position
)
SELECT EXISTS (SELECT FROM live), stream.last_position, stream.confirmed_position,
       ARRAY(SELECT DISTINCT event_id FROM marked)
FROM stream
"""


def _confirmed(
    client: Client, position: Any, actor: Actor, *, live: tuple[str, list]
) -> ReceiverStream | None:
    target = f"client:{client.name}"
    with audit.refusals_recorded(actor=actor, action="delivery.confirm", target=target):
        if isinstance(position, bool) or not isinstance(position, int) or position < 0:
            raise InvalidInput("position must be a whole number, 0 or more", field="position")
        may, last, confirmed, events = _confirm(client, position, live)
        if not may:
            return None
        if position > last:
            raise InvalidInput(
                f"position {position} is beyond this client's last delivery ({last})",
                field="position",
            )
    if events:
        transaction.on_commit(lambda: announcements.events_changed(events), robust=True)
    confirmed = max(confirmed, position)
    return ReceiverStream(client=client, last_position=last, confirmed_position=confirmed)


def _confirm(client: Client, position: int, live: tuple[str, list]) -> tuple:
    live_sql, live_params = live
    params = [*live_params, client.pk, client.pk, position, position, position]
    params += [client.pk, position, position]
    with prepared_cursor() as cursor:  # one statement: its own transaction
        cursor.execute(CONFIRM.format(live=live_sql), params)
        return cursor.fetchone()


EXPIRE_UNCONFIRMED = """
UPDATE broker_delivery AS d SET state = 'expired'
FROM broker_event AS e
WHERE d.state = 'pending' AND d.event_id = e.id AND e.expires_at <= now()
RETURNING d.event_id
"""


def expire_unconfirmed() -> int:
    """Deliveries whose event expired before their agent confirmed them are `expired`
    (the receiver was offline, or never said it had them); return how many changed."""
    with connection.cursor() as cursor:
        cursor.execute(EXPIRE_UNCONFIRMED)
        events = {row[0] for row in cursor.fetchall()}
        expired = cursor.rowcount
    if events:
        transaction.on_commit(lambda: announcements.events_changed(events), robust=True)
    return expired
