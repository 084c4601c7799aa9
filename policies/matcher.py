"""Symmetric matching: the receivers an event reaches, without looping over receivers.

A receiver gets an event iff the event's selector selects the receiver's
attributes AND the receiver's policy accepts the sender and the content.

* Receivers live in numbered *slots*; sets of receivers are bitsets.
* Receivers with the same policy (same minimal DNF) form one *group*: the
  policy is evaluated once per event however many receivers share it (a
  million servers registering the Macrocorp policy cost one evaluation).
* All groups' filters sit in a ``FilterIndex``, so even thousands of
  distinct policies are decided with a few bitset operations per attribute.
* Selector constraints are answered by per-attribute sorted indexes
  (``receiver_index``) as bitsets, intersected per DNF branch.
* The result is the selector's bitset intersected with the union of the
  accepting groups' bitsets, or, when few receivers are accepted, their
  members filtered by the selector bitset.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from itertools import compress, repeat
from operator import attrgetter, is_
from typing import Any

from policies.bitsets import (
    PendingBits,
    from_slots,
    has_slot,
    members,
    membership_test_bytes,
    without,
)
from policies.explain import Explanation, Verdict, check_policy, check_selector
from policies.expressions import EVENT, RECEIVER, SENDER, Constraint
from policies.filter_index import FilterIndex
from policies.filters import Filter
from policies.parser import parse_policy
from policies.receiver_index import AttributeIndex
from policies.rules import Policy, Selector

_ACCEPTANCE_CACHE = 1024
# The cache is probed over CACHE_PROBE lookups; if fewer than one in CACHE_WORTH hits
# (every event new, as in content-based workloads), the next CACHE_REST evaluations
# skip it: building its key costs a tenth of a small evaluation.
CACHE_PROBE, CACHE_WORTH, CACHE_REST = 256, 8, 4096
FEW_RECEIVERS = 256  # accepted receivers walked one by one rather than as bitsets
WALK_PER_GROUP = 4  # members worth walking per accepted group before bitsets win
_FREE = object()
_SHARED = object()  # in Matcher._solo: the position's group has not exactly one member
_MEMBERS = attrgetter("members")
_IDS = attrgetter("ids")


@dataclass(eq=False)
class _Group:
    """Receivers sharing one policy: their slots, their ids and their slots' bitset.

    Equal by identity: the filter index maps positions to group objects, and a
    group dropped after the index was built simply has no members left.
    """

    policy: Policy
    filters: list[Filter]
    members: set[int] = field(default_factory=set)
    ids: set[Hashable] = field(default_factory=set)
    bits: PendingBits = field(default_factory=PendingBits)
    positions: list[int] = field(default_factory=list)  # of its filters in the index

    def accepts(self, scopes: Mapping[str, Any]) -> bool:
        """Direct evaluation, for groups not yet in the filter index."""
        return any(f.matches(scopes) for f in self.filters)


@dataclass(slots=True)
class _Accepted:
    """What a policy evaluation found, as cached per (sender, content)."""

    bits: int  # positions of accepting filters in the current index
    extra: list[_Group]  # accepting groups not yet in the index
    groups: list[_Group] | None = None  # every accepting group, worked out when needed


class Matcher:
    """Holds receivers (attributes + policy) and finds the receivers of an event."""

    def __init__(self) -> None:
        self._slot_of: dict[Hashable, int] = {}
        self._ids: list[Any] = []
        self._free: list[int] = []
        self._group_of: list[int] = []
        self._live = PendingBits()
        self._attributes: dict[str, AttributeIndex] = {}
        self._groups: dict[int, _Group] = {}
        self._group_by_key: dict[frozenset[Filter], int] = {}
        self._group_by_policy: dict[Policy, int] = {}
        self._next_group = 0
        self._index: FilterIndex | None = None
        self._index_groups: list[_Group] = []
        # Filter position -> its group's only receiver: most content subscriptions
        # are alone with their policy, so their ids are found without visiting groups.
        self._solo: list[Any] = []
        self._shared = 0  # positions whose group has not exactly one receiver
        self._unindexed: set[int] = set()
        self._acceptance: OrderedDict[Hashable, _Accepted] = OrderedDict()
        self._cache_lookups = self._cache_hits = self._cache_rest = 0
        self._selectors: dict[Selector, list[Filter]] = {}

    # ------------------------------------------------------------------ receivers

    def __len__(self) -> int:
        return len(self._slot_of)

    def __contains__(self, receiver_id: object) -> bool:
        return receiver_id in self._slot_of

    def add(
        self, receiver_id: Hashable, attributes: Mapping[str, Any], policy: Policy | str
    ) -> None:
        """Register a receiver; its id must be new (use ``update`` to change one)."""
        if receiver_id in self._slot_of:
            raise ValueError(f"receiver {receiver_id!r} is already registered")
        slot = self._allocate(receiver_id)
        self._write_attributes(slot, attributes)
        self._join_group(slot, self._group_for(policy))
        self._live.add(slot)

    def update(
        self,
        receiver_id: Hashable,
        attributes: Mapping[str, Any] | None = None,
        policy: Policy | str | None = None,
        *,
        merge: bool = False,
    ) -> None:
        """Replace a receiver's attributes (or merge them in) and/or its policy."""
        slot = self._slot(receiver_id)
        if attributes is not None:
            if not merge:
                self._clear_attributes(slot, keep=attributes.keys())
            self._write_attributes(slot, attributes)
        if policy is not None:
            group = self._group_for(policy)
            if group != self._group_of[slot]:
                self._leave_group(slot)
                self._join_group(slot, group)

    def remove(self, receiver_id: Hashable) -> None:
        """Forget a receiver."""
        slot = self._slot(receiver_id)
        self._clear_attributes(slot, keep=())
        self._leave_group(slot)
        self._live.discard(slot)
        del self._slot_of[receiver_id]
        self._ids[slot] = _FREE
        self._free.append(slot)

    def attributes(self, receiver_id: Hashable) -> dict[str, Any]:
        """The receiver's current attributes."""
        slot = self._slot(receiver_id)
        found = {name: index.get(slot) for name, index in self._attributes.items()}
        return {name: value for name, value in found.items() if value is not None}

    def value(self, receiver_id: Hashable, name: str) -> Any:
        """The receiver's value of one attribute (None when it has none)."""
        index = self._attributes.get(name)
        return None if index is None else index.get(self._slot(receiver_id))

    def value_counts(self, name: str, receiver_ids: Iterable[Hashable]) -> Counter:
        """How many of these receivers hold each value of `name` (None: no value),
        read from the attribute's column without building each receiver's dict."""
        index = self._attributes.get(name)
        if index is None:
            return Counter({None: sum(1 for _ in receiver_ids)})
        get, slot_of = index.get, self._slot_of
        return Counter(get(slot_of[receiver_id]) for receiver_id in receiver_ids)

    def policy(self, receiver_id: Hashable) -> Policy:
        """The receiver's policy (the first registered among equivalent ones)."""
        return self._groups[self._group_of[self._slot(receiver_id)]].policy

    def _slot(self, receiver_id: Hashable) -> int:
        try:
            return self._slot_of[receiver_id]
        except KeyError:
            raise KeyError(f"unknown receiver {receiver_id!r}") from None

    def _allocate(self, receiver_id: Hashable) -> int:
        if self._free:
            slot = self._free.pop()
            self._ids[slot] = receiver_id
        else:
            slot = len(self._ids)
            self._ids.append(receiver_id)
            self._group_of.append(-1)
        self._slot_of[receiver_id] = slot
        return slot

    def _write_attributes(self, slot: int, attributes: Mapping[str, Any]) -> None:
        for name, value in attributes.items():
            index = self._attributes.get(name)
            if index is None:
                index = self._attributes[name] = AttributeIndex()
            index.set(slot, value)

    def _clear_attributes(self, slot: int, keep: Iterable[str]) -> None:
        kept = set(keep)
        for name, index in self._attributes.items():
            if name not in kept:
                index.set(slot, None)

    # ------------------------------------------------------------------ groups

    def _group_for(self, policy: Policy | str) -> int:
        if isinstance(policy, str):
            policy = parse_policy(policy)
        group = self._group_by_policy.get(policy)
        if group is not None and group in self._groups:
            return group
        key = frozenset(policy.filters())
        group = self._group_by_key.get(key)
        if group is None:
            group = self._new_group(policy, key)
        self._group_by_policy[policy] = group
        return group

    def _new_group(self, policy: Policy, key: frozenset[Filter]) -> int:
        group = self._next_group
        self._next_group += 1
        self._groups[group] = _Group(policy, sorted(key, key=Filter.text))
        self._group_by_key[key] = group
        self._unindexed.add(group)
        self._acceptance.clear()
        return group

    def _join_group(self, slot: int, group: int) -> None:
        self._group_of[slot] = group
        entry = self._groups[group]
        entry.members.add(slot)
        entry.ids.add(self._ids[slot])
        entry.bits.add(slot)
        if entry.positions and len(entry.ids) <= 2:
            self._mark_solo(entry)

    def _leave_group(self, slot: int) -> None:
        group = self._group_of[slot]
        entry = self._groups[group]
        entry.members.discard(slot)
        entry.ids.discard(self._ids[slot])
        if entry.positions and len(entry.ids) <= 1:
            self._mark_solo(entry)
        entry.bits.discard(slot)
        self._group_of[slot] = -1
        if not entry.members:
            self._drop_group(group)

    def _mark_solo(self, entry: _Group) -> None:
        """Record whether the group's filter positions lead to one receiver."""
        positions, only = from_slots(entry.positions), _solo_receiver(entry)
        if only is _SHARED:
            self._shared |= positions
        else:
            self._shared = without(self._shared, positions)
        for position in entry.positions:
            self._solo[position] = only

    def _drop_group(self, group: int) -> None:
        entry = self._groups.pop(group)
        del self._group_by_key[frozenset(entry.filters)]
        self._unindexed.discard(group)
        self._acceptance.clear()
        # Stale entries in _group_by_policy are ignored by _group_for.

    # ------------------------------------------------------------------ matching

    def prepare(self) -> None:
        """Build every lazy index now (otherwise the first events pay for it)."""
        self._refresh_index()
        live = self._live.bits
        for name in self._attributes:
            self._constraint_bits(Constraint(RECEIVER, name, "exists"), live)
        for entry in self._groups.values():
            _ = entry.bits.bits

    def match(
        self,
        sender: Mapping[str, Any] | None,
        content: Mapping[str, Any] | None,
        selector: Selector | None = None,
    ) -> set[Hashable]:
        """Ids of receivers selected by ``selector`` whose policy accepts sender+content."""
        accepted = self._accepted(sender or {}, content or {})
        if selector is None:
            return self._every_accepting(accepted)
        groups = self._groups_of(accepted)
        if not groups:
            return set()
        candidates = self._selected(selector)
        if candidates == 0:
            return set()
        return self._receivers_of(groups, candidates)

    def _every_accepting(self, accepted: _Accepted) -> set[Hashable]:
        """Receivers whose policy accepts, when no selector narrows them."""
        # Filters of one-receiver groups give their receiver directly; only the
        # other groups are visited.
        positions = members(accepted.bits)
        found = set(map(self._solo.__getitem__, positions))
        if _SHARED not in found and not accepted.extra:
            return found
        found.discard(_SHARED)
        receivers = map(self._solo.__getitem__, positions)
        shared = compress(positions, map(is_, receivers, repeat(_SHARED)))
        groups = set(map(self._index_groups.__getitem__, shared))
        groups.update(accepted.extra)
        return found.union(self._receivers_of(list(groups), None))

    def selected(self, selector: Selector | None) -> set[Hashable]:
        """Ids of receivers the selector selects (policies not consulted)."""
        bits = self._live.bits if selector is None else self._selected(selector)
        return {self._ids[slot] for slot in members(bits)}

    def _accepted(self, sender: Mapping[str, Any], content: Mapping[str, Any]) -> _Accepted:
        if self._cache_rest:
            self._cache_rest -= 1
            return self._evaluate({SENDER: sender, EVENT: content})
        key = _freeze(sender, content)
        cached = self._acceptance.get(key) if key is not None else None
        self._count_lookup(cached is not None)
        if cached is not None:
            self._acceptance.move_to_end(key)
            return cached
        accepted = self._evaluate({SENDER: sender, EVENT: content})
        if key is not None:
            self._acceptance[key] = accepted
            if len(self._acceptance) > _ACCEPTANCE_CACHE:
                self._acceptance.popitem(last=False)
        return accepted

    def _count_lookup(self, hit: bool) -> None:
        """Rest the cache for a while when it stopped paying for its keys."""
        self._cache_lookups += 1
        self._cache_hits += hit
        if self._cache_lookups == CACHE_PROBE:
            if self._cache_hits * CACHE_WORTH < CACHE_PROBE:
                self._cache_rest = CACHE_REST
            self._cache_lookups = self._cache_hits = 0

    def _evaluate(self, scopes: Mapping[str, Any]) -> _Accepted:
        self._refresh_index()
        assert self._index is not None
        extra = []
        for group in self._unindexed:
            if self._groups[group].accepts(scopes):
                extra.append(self._groups[group])
        return _Accepted(self._index.match(scopes), extra)

    def _groups_of(self, accepted: _Accepted) -> list[_Group]:
        """The accepting groups; some may have been dropped since (and be empty)."""
        if accepted.groups is None:
            found = set(map(self._index_groups.__getitem__, members(accepted.bits)))
            found.update(accepted.extra)
            accepted.groups = list(found)
        return accepted.groups

    def _refresh_index(self) -> None:
        """Rebuild the filter index when many groups are missing from it."""
        if self._index is not None and len(self._unindexed) <= max(8, len(self._groups) // 16):
            return
        filters: list[Filter] = []
        owners: list[_Group] = []
        for entry in self._groups.values():
            entry.positions = list(range(len(filters), len(filters) + len(entry.filters)))
            filters.extend(entry.filters)
            owners.extend([entry] * len(entry.filters))
        self._index = FilterIndex(filters)
        self._index_groups = owners
        self._unindexed.clear()
        self._acceptance.clear()  # cached positions are those of the old index
        self._solo = [_solo_receiver(entry) for entry in owners]
        self._shared = from_slots([p for p, only in enumerate(self._solo) if only is _SHARED])

    def _receivers_of(self, groups: list[_Group], candidates: int | None) -> set[Hashable]:
        accepted_count = sum(map(len, map(_MEMBERS, groups)))
        # Walking a member costs about as much as combining 8 kB of bitset:
        # small groups are walked, big ones combined as bitsets.
        union_cost = len(groups) * (WALK_PER_GROUP + len(self._ids) // 8192)
        if accepted_count <= max(FEW_RECEIVERS, union_cost):
            if candidates is None:
                return set().union(*map(_IDS, groups))
            table, ids = membership_test_bytes(candidates), self._ids
            return {ids[s] for group in groups for s in group.members if has_slot(table, s)}
        bits = self._union_of_groups(groups)
        slots = members(bits if candidates is None else bits & candidates)
        return set(map(self._ids.__getitem__, slots))

    def _union_of_groups(self, groups: list[_Group]) -> int:
        if len(groups) * 2 > len(self._groups):
            # Most groups accept: subtract the refusing ones from everyone.
            accepted = set(groups)
            refusing = [entry for entry in self._groups.values() if entry not in accepted]
            return without(self._live.bits, _union(entry.bits.bits for entry in refusing))
        return _union(entry.bits.bits for entry in groups)

    # ------------------------------------------------------------------ selectors

    def _selector_filters(self, selector: Selector) -> list[Filter]:
        filters = self._selectors.get(selector)
        if filters is None:
            if len(self._selectors) > 4096:
                self._selectors.clear()
            filters = self._selectors[selector] = selector.filters()
        return filters

    def _selected(self, selector: Selector) -> int:
        live = self._live.bits
        union = 0
        for f in self._selector_filters(selector):
            bits = live
            for constraint in f.sorted_constraints():
                bits &= self._constraint_bits(constraint, live)
                if not bits:
                    break
            union |= bits
        return union

    def _constraint_bits(self, constraint: Constraint, live: int) -> int:
        index = self._attributes.get(constraint.name)
        if constraint.op == "not exists":
            present = index.positive(constraint.negate()) if index else 0
            return without(live, present)
        if constraint.negated:
            holds = index.positive(constraint.positive()) if index else 0
            return without(live, holds)
        return index.positive(constraint) if index else 0

    # ------------------------------------------------------------------ explain

    def explain(
        self,
        receiver_id: Hashable,
        sender: Mapping[str, Any] | None,
        content: Mapping[str, Any] | None,
        selector: Selector | None = None,
    ) -> Explanation:
        """Why ``match`` does or does not deliver this event to this receiver."""
        receiver = self.attributes(receiver_id)
        policy = self.policy(receiver_id)
        return Explanation(
            receiver_id,
            selector is None,
            check_selector(selector, receiver),
            check_policy(policy, sender, content),
        )


def _solo_receiver(entry: _Group) -> Any:
    """The group's only receiver, or ``_SHARED``."""
    if len(entry.ids) != 1:
        return _SHARED
    (only,) = entry.ids
    return only


def _union(bitsets: Iterable[int]) -> int:
    union = 0
    for bits in bitsets:
        union |= bits
    return union


def _freeze(sender: Mapping[str, Any], content: Mapping[str, Any]) -> Hashable | None:
    """Hashable key of a (sender, content) pair, or None if a value is unhashable.

    Built by C-level calls only (it is paid by every event). The key follows the
    order of the items, so the same attributes in another order only miss the cache.
    """
    try:
        # Types are part of the key: 1 and true are different attribute values.
        key = (
            tuple(sender.items()),
            tuple(map(type, sender.values())),
            tuple(content.items()),
            tuple(map(type, content.values())),
        )
        hash(key)
    except TypeError:
        return None
    return key


__all__ = ["Explanation", "Matcher", "Verdict"]
