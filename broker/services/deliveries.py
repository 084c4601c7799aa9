"""What receivers do with their deliveries: confirm that they have them, acknowledge
them with results; and what becomes of those never confirmed before their event expired."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from django.db import connection, transaction

from broker import audit
from broker.audit import Actor
from broker.credentials import key_digest
from broker.errors import BrokerError, InvalidInput, NotFound
from broker.models import Client, Delivery
from broker.prepared import int_array, prepared_cursor, text_array
from broker.push import to_consoles
from broker.reads.clients import live_token_ids_sql

MAX_RESULT_BYTES = 16 * 1024
MAX_ID = 2**63 - 1  # PostgreSQL's bigint
ACK_STATUSES = {"ok": Delivery.State.ACKED, "failed": Delivery.State.FAILED}


@dataclass(frozen=True)
class Answer:
    """A client's agent handled one of its deliveries: `status` "ok" or "failed",
    with the command's `result` (an object, or None)."""

    client: Client
    delivery_id: Any
    status: Any
    result: Any
    actor: Actor


def acknowledge_delivery(
    *, client: Client, delivery_id: Any, status: Any, result: Any = None, actor: Actor
) -> None:
    """Record that `client` handled one of its deliveries, with the command's result.

    Acknowledging again with the same status changes nothing (agents retry after a
    reconnect); changing an answered delivery's status is refused.
    """
    (outcome,) = acknowledge_deliveries([Answer(client, delivery_id, status, result, actor)])
    if outcome is not None:
        raise outcome


def acknowledge_deliveries(answers: list[Answer]) -> list[BrokerError | None]:
    """Many answers (of distinct deliveries) in one statement, as agents' sessions send
    them in bursts: each one's refusal (audited), or None once recorded, in order."""
    if len({a.delivery_id for a in answers}) != len(answers):
        raise ValueError("answers in one statement must be of distinct deliveries")
    checked = [_checked_answer(a) for a in answers]
    valid = [
        (a, state) for a, state in zip(answers, checked, strict=True) if isinstance(state, str)
    ]
    rows = iter(_answer_all(valid) if valid else [])
    return [
        _answer_outcome(a, state, *next(rows)) if isinstance(state, str) else state
        for a, state in zip(answers, checked, strict=True)
    ]


def _checked_answer(answer: Answer) -> str | BrokerError:
    """The delivery's new state, or the answer's refusal (audited)."""
    try:
        with _answer_refusals_audited(answer):
            state = _checked_ack(answer.delivery_id, answer.status, answer.result)
            if not 0 < answer.delivery_id <= MAX_ID:  # no such row: not worth a query
                raise _no_such_delivery(answer.delivery_id)
            return state
    except BrokerError as error:
        return error


def _answer_refusals_audited(answer: Answer):
    target = f"client:{answer.client.name}"
    return audit.refusals_recorded(actor=answer.actor, action="delivery.ack", target=target)


def _answer_outcome(
    answer: Answer, state: str, found: bool, old_state: str, same_result: bool, event_id, answered
) -> BrokerError | None:
    delivery_id = answer.delivery_id
    try:
        with _answer_refusals_audited(answer):
            if not found:
                raise _no_such_delivery(delivery_id)
            if not answered and (old_state != state or not same_result):
                raise InvalidInput(
                    f"delivery {delivery_id} was already answered ({old_state})",
                    field="delivery",
                )
    except BrokerError as error:
        return error
    if answered:
        transaction.on_commit(lambda: to_consoles.events_changed([event_id]), robust=True)
    return None


def _no_such_delivery(delivery_id: int) -> NotFound:
    # Another receiver's delivery is "not found" too: ids reveal nothing.
    return NotFound(f"no delivery {delivery_id} for this client", field="delivery")


# Answers in one statement: the deliveries locked (in id order), each answered unless it
# already was; then for each answer, whether its delivery was found, its state before,
# whether its result was this one, its event, whether this answered it, and the time.
ANSWER_ALL = f"""
WITH input AS (
    SELECT * FROM unnest(%(deliveries)s::bigint[], %(receivers)s::bigint[], %(states)s::text[],
                         %(results)s::jsonb[], %(actors)s::text[])
        WITH ORDINALITY AS i(delivery, receiver, state, result, actor, ord)
),
old AS (
    SELECT d.id, d.expires_at, d.state, d.result, d.event_id, input.ord
    FROM broker_delivery AS d JOIN input ON d.id = input.delivery AND d.receiver_id = input.receiver
    WHERE d.expires_at > {Delivery.FINAL_AFTER_SQL}
    ORDER BY d.id FOR UPDATE OF d
),
answered AS (
    UPDATE broker_delivery AS d
    SET state = input.state, result = input.result, acked_at = now(),
        received_at = coalesce(d.received_at, now())
    FROM old JOIN input ON input.ord = old.ord
    WHERE d.id = old.id AND d.expires_at = old.expires_at AND old.state NOT IN ('acked', 'failed')
    RETURNING d.id, d.event_id, input.ord, input.state, input.actor
)
SELECT old.id IS NOT NULL, old.state, old.result IS NOT DISTINCT FROM input.result,
       old.event_id, EXISTS (SELECT FROM answered WHERE answered.ord = input.ord), now()
FROM input LEFT JOIN old ON old.ord = input.ord
ORDER BY input.ord
"""


def _answer_all(answers: list[tuple[Answer, str]]) -> list[tuple]:
    params = {
        "deliveries": int_array(a.delivery_id for a, _ in answers),
        "receivers": int_array(a.client.pk for a, _ in answers),
        "states": text_array(state for _, state in answers),
        # No result: SQL NULL (not JSON null).
        "results": text_array(_json_or_none(a.result) for a, _ in answers),
        "actors": text_array(a.actor for a, _ in answers),
    }
    with transaction.atomic(), prepared_cursor() as cursor:
        cursor.execute(ANSWER_ALL, params)
        rows = cursor.fetchall()
        _audit_answered(answers, rows)
    return [row[:5] for row in rows]


def _audit_answered(answers: list[tuple[Answer, str]], rows: list[tuple]) -> None:
    """The entries that audit.record_change would write for the answers that answered
    their delivery, at the moment the statement wrote them (its now(), the deliveries'
    acked_at), with their authentication codes: made here, with a key the database
    does not hold, so not in the statement."""
    audit.record_changes([
        audit.Change(answer.actor, "delivery.ack", f"event:{event_id}",
                     {"delivery": answer.delivery_id, "state": state})
        for (answer, state), (*_, event_id, answered, _at) in zip(answers, rows, strict=True)
        if answered
    ], at=rows[0][5])  # fmt: skip


def _json_or_none(result: dict | None) -> str | None:
    return None if result is None else json.dumps(result)


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


@dataclass(frozen=True, slots=True)
class StreamEnds:
    """What a confirmation answers: how far the client's stream goes, and up to where
    its agent has confirmed it (a model instance per answer cost a fleet's heartbeats
    Django's signals)."""

    client: Client
    last_position: int
    confirmed_position: int


@dataclass(frozen=True)
class Confirmation:
    """A client's agent has every delivery up to `position` (its stream's numbering).
    With a session's `token`, it counts only while the token still lets the client in
    (broker.reads.clients.live_tokens)."""

    client: Client
    position: Any
    actor: Actor
    token: str | None = None


def confirm_receipt(*, client: Client, position: Any, actor: Actor) -> StreamEnds:
    """The client's agent has every delivery up to `position`: they are `delivered`.
    Confirming less than before changes nothing. Returns the stream's ends, whose
    `last_position` tells the agent whether it is missing some."""
    return _one(Confirmation(client, position, actor))


def confirm_receipt_while_live(
    *, token: str, client: Client, position: Any, actor: Actor
) -> StreamEnds | None:
    """`confirm_receipt` for a session: None, and nothing changed, if `token` no
    longer lets `client` in; else the stream, as there."""
    return _one(Confirmation(client, position, actor, token))


def _one(confirmation: Confirmation) -> StreamEnds | None:
    (outcome,) = confirm_receipts([confirmation])
    if isinstance(outcome, BrokerError):
        raise outcome
    return outcome


def confirm_receipts(
    confirmations: list[Confirmation],
) -> list[StreamEnds | BrokerError | None]:
    """Many confirmations (of distinct clients) in one statement, as agents' sessions
    send them in bursts: each one's outcome in order, the stream, None (its token no
    longer lets it in) or its refusal (audited), as `confirm_receipt` would give it."""
    if len({c.client.pk for c in confirmations}) != len(confirmations):
        raise ValueError("confirmations in one statement must be of distinct clients")
    outcomes: list[StreamEnds | BrokerError | Confirmation | None] = [
        _refused_position(c) or c for c in confirmations
    ]
    valid = [c for c in outcomes if isinstance(c, Confirmation)]
    rows = iter(_confirm_all(valid) if valid else [])
    return [c if not isinstance(c, Confirmation) else _outcome(c, *next(rows)) for c in outcomes]


def _refused_position(confirmation: Confirmation) -> BrokerError | None:
    position = confirmation.position
    if isinstance(position, bool) or not isinstance(position, int) or position < 0:
        return _refusal(confirmation, "position must be a whole number, 0 or more")
    if position > MAX_ID:  # beyond any stream: not worth a query (nor valid in one)
        return _refusal(confirmation, f"position {position} is beyond this client's stream")
    return None


def _refusal(confirmation: Confirmation, message: str) -> BrokerError:
    """The refusal, audited as the confirmation's."""
    target = f"client:{confirmation.client.name}"
    try:
        with audit.refusals_recorded(
            actor=confirmation.actor, action="delivery.confirm", target=target
        ):
            raise InvalidInput(message, field="position")
    except BrokerError as error:
        return error


def _outcome(
    confirmation: Confirmation, may: bool, last: int, confirmed: int, events: list
) -> StreamEnds | BrokerError | None:
    if not may:
        return None
    position = confirmation.position
    if position > last:
        return _refusal(
            confirmation, f"position {position} is beyond this client's last delivery ({last})"
        )
    if events:
        transaction.on_commit(lambda: to_consoles.events_changed(events), robust=True)
    confirmed = max(confirmed, position)
    return StreamEnds(confirmation.client, last, confirmed)


# Confirmations in one statement: for each, whether the client may confirm (a session's
# token still live; none given: yes), the stream's end, the deliveries marked received
# (pending and expired ones: an agent that says it has a delivery has it, even if its
# event expired before it said so) and the stream's new confirmed position, which only
# grows. Only streams that move are locked (an idle agent's repeated confirmation writes
# nothing), in client order, as the leaves' delivery inserts lock them: two statements
# locking the same streams cannot deadlock. Locking re-checks the row it locks.
CONFIRM_ALL = """
WITH input AS (
    SELECT * FROM unnest(%s::bigint[], %s::bigint[], %s::text[])
        WITH ORDINALITY AS i(client_id, position, digest, ord)
),
live AS (
    SELECT input.client_id FROM input
    WHERE input.digest IS NULL OR EXISTS (
        SELECT FROM broker_clienttoken AS t
        WHERE t.id IN ({live_ids}) AND t.client_id = input.client_id
    )
),
stream AS (
    SELECT input.ord, input.client_id,
           coalesce(s.last_position, 0) AS last_position,
           coalesce(s.confirmed_position, 0) AS confirmed_position
    FROM input LEFT JOIN broker_receiverstream AS s ON s.client_id = input.client_id
),
locked AS (
    SELECT s.client_id, s.confirmed_position, input.position
    FROM broker_receiverstream AS s JOIN input ON input.client_id = s.client_id
    WHERE s.client_id IN (SELECT client_id FROM live)
      AND s.confirmed_position < input.position AND input.position <= s.last_position
    ORDER BY s.client_id
    FOR UPDATE OF s
),
marked AS (
    UPDATE broker_delivery AS d SET state = 'delivered', received_at = now()
    FROM locked
    WHERE d.receiver_id = locked.client_id
      AND d.position > locked.confirmed_position AND d.position <= locked.position
      AND d.state IN ('pending', 'expired') AND d.expires_at > {final}
    RETURNING d.receiver_id, d.event_id
),
moved AS (
    UPDATE broker_receiverstream AS s SET confirmed_position = locked.position
    FROM locked WHERE s.client_id = locked.client_id
)
SELECT live.client_id IS NOT NULL, stream.last_position, stream.confirmed_position,
       ARRAY(SELECT DISTINCT m.event_id FROM marked AS m WHERE m.receiver_id = stream.client_id)
FROM stream LEFT JOIN live ON live.client_id = stream.client_id
ORDER BY stream.ord
"""


def _confirm_all(confirmations: list[Confirmation]) -> list[tuple]:
    # The live-token rule's one parameter (the digest) is each row's own.
    sql = CONFIRM_ALL.format(
        live_ids=live_token_ids_sql().replace("%s", "input.digest"), final=Delivery.FINAL_AFTER_SQL
    )
    columns = [
        int_array(c.client.pk for c in confirmations),
        int_array(c.position for c in confirmations),
        text_array(None if c.token is None else key_digest(c.token) for c in confirmations),
    ]
    with prepared_cursor() as cursor:  # one statement: its own transaction
        cursor.execute(sql, columns)
        return cursor.fetchall()


EXPIRE_UNCONFIRMED = f"""
UPDATE broker_delivery AS d SET state = 'expired'
WHERE d.state = 'pending' AND d.expires_at <= now()
    AND d.expires_at > {Delivery.FINAL_AFTER_SQL}
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
        transaction.on_commit(lambda: to_consoles.events_changed(events), robust=True)
    return expired


# How far one login may move its client's stream: a restore loses the deliveries since
# its backup, far fewer; and a client may not push its own numbering toward the end of
# 64 bits, where no position would be left to give it.
STREAM_CATCH_UP_MAX = 1_000_000


@dataclass(frozen=True)
class AheadOfStream:
    """An agent logging in with `position`, beyond its stream's `end`: it holds
    deliveries the database no longer has (restored from an older backup)."""

    client: Client
    end: int
    position: int


def catch_streams_up(*, ahead: list[AheadOfStream]) -> dict[int, int]:
    """Move each stream's end and confirmed position up to what its agent holds (by
    at most STREAM_CATCH_UP_MAX), so that the next delivery is numbered past it: the
    agent would otherwise drop it as a repeat of one it has. Audited per client.
    Returns {client id: the stream's new end}."""
    moves = {a.client.pk: min(a.position, a.end + STREAM_CATCH_UP_MAX) for a in ahead}
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(CATCH_UP, [int_array(moves), int_array(moves.values())])
            ends = dict(cursor.fetchall())
        audit.record_changes([_caught_up(a, ends[a.client.pk]) for a in ahead])
    return ends


def _caught_up(ahead: AheadOfStream, end: int) -> audit.Change:
    return audit.Change(
        actor=Actor("client", ahead.client.name),
        action="delivery.stream_caught_up",
        target=f"client:{ahead.client.name}",
        details={"from": ahead.end, "to": end, "agent_position": ahead.position},
    )


# In client order, as the leaves lock streams; only ever forward.
CATCH_UP = """
INSERT INTO broker_receiverstream AS s (client_id, last_position, confirmed_position)
SELECT i.client_id, i.position, i.position
FROM unnest(%s::bigint[], %s::bigint[]) AS i(client_id, position)
ORDER BY i.client_id
ON CONFLICT (client_id) DO UPDATE SET
    last_position = greatest(s.last_position, EXCLUDED.last_position),
    confirmed_position = greatest(s.confirmed_position, EXCLUDED.confirmed_position)
RETURNING client_id, last_position
"""
