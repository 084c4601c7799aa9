"""Building the dispatcher tree and attaching clients to its leaves."""

from __future__ import annotations

import heapq

from django.conf import settings
from django.db import transaction
from django.db.models import Count

from broker import audit
from broker.audit import Actor
from broker.dispatch.queues import dispatcher_names
from broker.errors import InvalidInput
from broker.models import Client, Dispatcher

MAX_DEPTH = 6
MAX_BRANCHING = 32


def build_tree(*, depth: int, branching: int, actor: Actor) -> list[Dispatcher]:
    """Create a tree of `depth` levels (1 = a lone root) with `branching` children per
    node, then spread existing clients over its leaves. Only on an empty tree."""
    if not 1 <= depth <= MAX_DEPTH:
        raise InvalidInput(f"depth must be between 1 and {MAX_DEPTH}", field="depth")
    if not 1 <= branching <= MAX_BRANCHING:
        raise InvalidInput(f"branching must be between 1 and {MAX_BRANCHING}", field="branching")
    with transaction.atomic():
        if Dispatcher.objects.exists():
            raise InvalidInput("the dispatcher tree already exists", field="depth")
        nodes = _create_levels(depth, branching)
        _spread_clients()
        audit.record_change(
            actor=actor,
            action="tree.build",
            target="tree",
            details={"depth": depth, "branching": branching, "dispatchers": len(nodes)},
        )
    return nodes


def _create_levels(depth: int, branching: int) -> list[Dispatcher]:
    by_name: dict[str, Dispatcher] = {}
    for name in dispatcher_names(depth, branching):
        parent_name, _, _ = name.rpartition(".")
        level = name.count(".")
        by_name[name] = Dispatcher.objects.create(
            name=name, parent=by_name.get(parent_name), depth=level, is_leaf=level == depth - 1
        )
    return list(by_name.values())


def _spread_clients() -> None:
    for client in Client.objects.filter(dispatcher__isnull=True).order_by("id"):
        client.dispatcher = attach_to_leaf()
        client.save(update_fields=["dispatcher"])


def ensure_tree() -> None:
    """Create the configured default tree if there is none yet."""
    if not Dispatcher.objects.exists():
        build_tree(depth=settings.TREE_DEPTH, branching=settings.TREE_BRANCHING, actor=audit.SYSTEM)


def attach_to_leaf() -> Dispatcher:
    """The leaf with the fewest clients (ties: the oldest), creating the tree if needed."""
    ensure_tree()
    return (
        Dispatcher.objects.filter(is_leaf=True)
        .annotate(load=Count("clients"))
        .order_by("load", "id")
        .first()
    )


def spread_over_leaves(count: int) -> list[int]:
    """The ids of the leaves that `count` successive attach_to_leaf() calls would pick,
    in order, worked out from one query (for registering a fleet in bulk)."""
    ensure_tree()
    loads = Dispatcher.objects.filter(is_leaf=True).annotate(load=Count("clients"))
    heap = [(leaf.load, leaf.id) for leaf in loads]
    heapq.heapify(heap)
    picked = []
    for _ in range(count):
        load, leaf_id = heapq.heappop(heap)
        picked.append(leaf_id)
        heapq.heappush(heap, (load + 1, leaf_id))
    return picked
