"""A brute-force oracle for the tree: what every receiver should get, by loops."""

from __future__ import annotations

from broker.models import Client, Delivery, Event
from broker.reads.clients import current_attributes
from broker.reads.policies import current_policy
from broker.vocabulary import vocabulary


def receiver_states() -> dict[int, tuple[dict, object]]:
    """{receiver id: (attributes, policy)} of every receiver with a policy, now, typed
    by the vocabulary as the service types it."""
    words = vocabulary()
    states = {}
    for client in Client.objects.filter(can_receive=True, is_active=True):
        version = current_policy(client)
        if version is not None:
            states[client.id] = (current_attributes(client), words.policy(version.text))
    return states


def matching(event: Event, states: dict[int, tuple[dict, object]]) -> set[int]:
    """Receivers whose attributes the selector selects and whose policy accepts."""
    selector = vocabulary().selector(event.selector) if event.selector else None
    return {
        receiver_id
        for receiver_id, (attributes, policy) in states.items()
        if (selector is None or selector.selects(attributes))
        and policy.accepts(event.sender_attributes, event.content)
    }


def delivered(event: Event) -> set[int]:
    return set(Delivery.objects.filter(event=event).values_list("receiver_id", flat=True))
