"""The fleet and the tree as synthetic traffic sees them, read once: receivers in
groups that no selector or policy can tell apart, senders with their attested
attributes, and the tree's paths."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from typing import NamedTuple

from django.db.models import TextField
from django.db.models.functions import Cast

from broker.dispatch.state import Topology
from broker.models import Client
from broker.reads.clients import attested_attributes, live_attribute_values
from broker.reads.policies import newest_policies

# Unique to one server or changing every few seconds: no traffic selects on them here.
VOLATILE = frozenset({"hostname", "load"})


class Receiver(NamedTuple):
    """One receiver: where it is attached and what tells it apart (a tuple: a fleet
    has a hundred thousand)."""

    id: int
    name: str
    leaf: int
    attributes: tuple  # sorted (name, value) pairs of its stable live attributes
    policy: str  # its newest policy, canonical
    policy_text: str  # the same, as typed
    policy_version: int


@dataclass
class Group:
    """Receivers with the same stable attributes and policy: every selector and every
    policy treats them alike, so an event is routed once per group, not per receiver."""

    index: int
    attributes: dict
    policy: str
    policy_text: str
    members: list[Receiver] = field(default_factory=list)
    by_leaf: dict[int, list[Receiver]] = field(default_factory=dict)


def read_receivers() -> list[Receiver]:
    """Active receivers attached to a leaf and holding a policy, by id."""
    clients = (
        Client.objects.filter(is_active=True, can_receive=True, dispatcher__isnull=False)
        .order_by("id")
        .values_list("id", "name", "dispatcher_id")
    )
    values = _stable_values()
    canonical, typed = newest_policies(), newest_policies(field="text")
    versions = newest_policies(field="version")
    return [
        Receiver(pk, name, leaf, tuple(sorted(values[pk].items())), canonical[pk], typed[pk],
                 versions[pk])
        for pk, name, leaf in clients
        if pk in canonical
    ]  # fmt: skip


def _stable_values() -> dict[int, dict]:
    # Read as text and decoded here: the field's own decoding of 500,000 values (a
    # fleet of 100,000) took seconds.
    rows = (
        live_attribute_values().exclude(name__in=VOLATILE).annotate(text=Cast("value", TextField()))
    )
    found: dict[int, dict] = defaultdict(dict)
    for client_id, name, text in rows.values_list("client_id", "name", "text"):
        found[client_id][name] = json.loads(text)
    return found


@dataclass
class Fleet:
    """The receivers, their groups, and each receiver's group (by id)."""

    receivers: list[Receiver]
    groups: list[Group]
    group_of: dict[int, int]

    @classmethod
    def read(cls) -> Fleet:
        receivers = read_receivers()
        groups = group_receivers(receivers)
        group_of = {r.id: group.index for group in groups for r in group.members}
        return cls(receivers, groups, group_of)


def group_receivers(receivers: list[Receiver]) -> list[Group]:
    """Receivers by (attributes, policy), each group's members by leaf too."""
    groups: dict[tuple, Group] = {}
    for receiver in receivers:
        key = (receiver.attributes, receiver.policy)
        group = groups.get(key)
        if group is None:
            group = groups[key] = Group(
                len(groups), dict(receiver.attributes), receiver.policy, receiver.policy_text
            )
        group.members.append(receiver)
        group.by_leaf.setdefault(receiver.leaf, []).append(receiver)
    return list(groups.values())


@dataclass(frozen=True)
class Sender:
    """A client that sends, with what its authorities attested before the incident."""

    id: int
    name: str
    leaf: int
    attributes: dict


def read_senders() -> dict[str, Sender]:
    """Every active sender attached to a leaf, by name."""
    senders = Client.objects.filter(is_active=True, can_send=True, dispatcher__isnull=False)
    return {
        client.name: Sender(client.pk, client.name, client.dispatcher_id,
                            attested_attributes(client))
        for client in senders.order_by("id")
    }  # fmt: skip


@dataclass
class Tree:
    """The dispatcher tree: each node's children and parent, each leaf's path up."""

    topology: Topology
    below: dict[int, list[int]]  # leaves under each dispatcher

    @classmethod
    def read(cls) -> Tree:
        topology = Topology.load()
        below: dict[int, list[int]] = {node: [] for node in topology.parent}
        for leaf in sorted(topology.leaves):
            for node in cls.path_of(topology, leaf):
                below[node].append(leaf)
        return cls(topology, below)

    @staticmethod
    def path_of(topology: Topology, leaf: int) -> list[int]:
        path = [leaf]
        while topology.parent[path[-1]] is not None:
            path.append(topology.parent[path[-1]])
        return path

    def path_up(self, leaf: int) -> list[int]:
        """From `leaf` to the root."""
        return self.path_of(self.topology, leaf)

    def children(self, node: int) -> list[int]:
        return self.topology.children[node]

    def is_leaf(self, node: int) -> bool:
        return node in self.topology.leaves
