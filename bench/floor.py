"""The transport floor: the same hops through the same broker, doing no work.

    python -m bench.floor             # a relay (started by bench.pingpong, one per worker)

A floor relay reads the dispatchers' hop streams exactly as the tree's consumers do
(broker/dispatch/consumer.py: same streams, group, batches and acknowledgement), and
for each hop does only what any tree must: send it on, up to the root and down to
every child (a blind relay), and at a leaf push it to each client attached there
through the same channel layer. No database, no matching, no deliveries: what is left
is the cost of the hops themselves, the floor SN's round trip is measured against.
"""

from __future__ import annotations

import os
import threading
import uuid
from datetime import timedelta


def floor_event(sender_id: int, sequence: int, content: dict) -> dict:
    """An event in its wire shape that no database knows of."""
    from django.utils import timezone

    return {
        "id": str(uuid.uuid4()),
        "sender_id": sender_id,
        "channel": "floor",
        "sequence": sequence,
        "content": content,
        "selector": "",
        "sender_attributes": {},
        "expires_at": (timezone.now() + timedelta(minutes=1)).isoformat(),
        "recipients": None,
    }


def publish_floor_event(sender, sequence: int, content: dict) -> None:
    """What publishing is at the floor: the first hop, nothing written."""
    from broker.dispatch import transport
    from broker.dispatch.steps import UP

    event = floor_event(sender.id, sequence, content)
    transport.send([transport.RouteHop(sender.dispatcher_id, [event], UP)])


def relay_consumer_class():
    """HopConsumer with its routing replaced by a blind relay and a bare push."""
    from broker.dispatch import state, transport
    from broker.dispatch.consumer import HopConsumer
    from broker.dispatch.steps import DOWN, UP
    from broker.models import Client
    from broker.push.to_agents import Pushed, push

    attached: dict[int, list[int]] = {}
    for client_id, leaf_id in Client.objects.values_list("id", "dispatcher_id"):
        attached.setdefault(leaf_id, []).append(client_id)
    tree = state.topology()

    class RelayConsumer(HopConsumer):
        def route(self, entries) -> int:
            hops = [entry.hop for entry in entries if entry.hop is not None]
            for hop in hops:
                self._relay(hop)
            pipeline = transport.broker_redis().pipeline(transaction=True)
            transport.acknowledge(entries, pipeline)
            pipeline.execute()
            return len(hops)

        def _relay(self, hop) -> None:
            here = hop.dispatcher_id
            children = [c for c in tree.children[here] if c != hop.came_from]
            onward = [transport.RouteHop(c, hop.events, DOWN) for c in children]
            if hop.direction == UP and tree.parent[here] is not None:
                onward.append(transport.RouteHop(tree.parent[here], hop.events, UP, here))
            transport.send(onward)
            push(
                Pushed(0, 0, to, e["id"], e["sender_id"], "floor", e["sequence"], e["content"])
                for e in hop.events
                for to in attached.get(here, [])
            )

    return RelayConsumer


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    import django

    django.setup()
    from bench.services import tree_queues

    queues = [queue for queue in tree_queues() if queue.startswith("dispatcher.")]
    relay = relay_consumer_class()(queues)
    relay.run(threading.Event())


if __name__ == "__main__":
    main()
