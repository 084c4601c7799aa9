"""What receivers do with their deliveries: acknowledge them and report results."""

from __future__ import annotations

import json
from typing import Any

from django.db import transaction
from django.utils import timezone

from broker import audit
from broker.audit import Actor
from broker.errors import InvalidInput, NotFound
from broker.models import Client, Delivery

MAX_RESULT_BYTES = 16 * 1024
ACK_STATUSES = {"ok": Delivery.State.ACKED, "failed": Delivery.State.FAILED}


def acknowledge_delivery(
    *, client: Client, delivery_id: Any, status: Any, result: Any = None, actor: Actor
) -> Delivery:
    """Record that `client` handled one of its deliveries, with the command's result.

    Acknowledging again with the same status changes nothing (agents retry after a
    reconnect); changing an answered delivery's status is refused.
    """
    target = f"client:{client.name}"
    with audit.refusals_recorded(actor=actor, action="delivery.ack", target=target):
        state = _checked_ack(delivery_id, status, result)
        with transaction.atomic():
            delivery = _own_delivery(client, delivery_id)
            if delivery.state == state and delivery.result == result:
                return delivery
            if delivery.state != Delivery.State.DELIVERED:
                raise InvalidInput(
                    f"delivery {delivery_id} was already answered ({delivery.state})",
                    field="delivery",
                )
            return _record_answer(delivery, state, result, actor)


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


def _own_delivery(client: Client, delivery_id: int) -> Delivery:
    # Another receiver's delivery is "not found", not "forbidden": ids reveal nothing.
    delivery = Delivery.objects.select_for_update().filter(pk=delivery_id, receiver=client).first()
    if delivery is None:
        raise NotFound(f"no delivery {delivery_id} for this client", field="delivery")
    return delivery


def _record_answer(delivery: Delivery, state: str, result: Any, actor: Actor) -> Delivery:
    delivery.state = state
    delivery.result = result
    delivery.acked_at = timezone.now()
    delivery.save(update_fields=["state", "result", "acked_at"])
    audit.record_change(
        actor=actor,
        action="delivery.ack",
        target=f"event:{delivery.event_id}",
        details={"delivery": delivery.pk, "state": state},
    )
    return delivery
