"""Pushing deliveries to connected receivers through the channel layer (Redis).

Every receiver's connection joins the group `client.<id>`. A leaf pushes, after its
deliveries commit, one message per receiver holding that receiver's new deliveries in
order, so that order survives the trip. The database stays the record: a receiver that
was not connected reads what it missed from there when it comes back.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

MESSAGE_TYPE = "deliveries.push"


@dataclass(frozen=True)
class Pushed:
    """One new delivery as it is pushed."""

    delivery_id: int
    receiver_id: int
    event_id: str
    sender_id: int
    channel: str
    sequence: int
    content: dict[str, Any]

    def as_message(self) -> dict[str, Any]:
        return {
            "delivery": self.delivery_id,
            "event": self.event_id,
            "sender": self.sender_id,
            "channel": self.channel,
            "sequence": self.sequence,
            "content": self.content,
        }


def client_group(client_id: int) -> str:
    """The channel-layer group of one client's live connections."""
    return f"client.{client_id}"


def push(deliveries: Iterable[Pushed]) -> None:
    """Send each receiver its deliveries, in the given order, in one message."""
    by_receiver: dict[int, list[dict]] = {}
    for delivery in deliveries:
        by_receiver.setdefault(delivery.receiver_id, []).append(delivery.as_message())
    if by_receiver:
        async_to_sync(_send_all)(by_receiver)


async def _send_all(by_receiver: dict[int, list[dict]]) -> None:
    layer = get_channel_layer()
    await asyncio.gather(
        *(
            layer.group_send(client_group(receiver), {"type": MESSAGE_TYPE, "items": items})
            for receiver, items in by_receiver.items()
        )
    )
