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
from typing import Any

from policies.bitsets import (
    PendingBits,
    has_slot,
    members,
    membership_test_bytes,
    without,
)
from policies.explain import Explanation, Verdict, check_policy, check_selector
from policies.expressions import EVENT, RECEIVER, SENDER, Constraint, Policy, Selector
from policies.filter_index import FilterIndex
from policies.filters import Filter
from policies.parser import parse_policy, parse_selector
from policies.receiver_index import AttributeIndex

_ACCEPTANCE_CACHE = 1024
FEW_RECEIVERS = 256  # accepted receivers walked one by one rather than as bitsets
WALK_PER_GROUP = 4  # members worth walking per accepted group before bitsets win
_FREE = object()


@dataclass
class _Group:
    """Receivers sharing one policy."""

    policy: Policy
    filters: list[Filter]
    members: set[int] = field(default_factory=set)
    bits: PendingBits = field(default_factory=PendingBits)

    def accepts(self, scopes: Mapping[str, Any]) -> bool:
        """Direct evaluation, for groups not yet in the filter index."""
        return any(f.matches(scopes) for f in self.filters)


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
        self._index_groups: list[int] = []
        self._unindexed: set[int] = set()
        self._acceptance: OrderedDict[Hashable, list[int]] = OrderedDict()
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
        self._groups[group].members.add(slot)
        self._groups[group].bits.add(slot)

    def _leave_group(self, slot: int) -> None:
        group = self._group_of[slot]
        entry = self._groups[group]
        entry.members.discard(slot)
        entry.bits.discard(slot)
        self._group_of[slot] = -1
        if not entry.members:
            self._drop_group(group)

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
        selector: Selector | str | None = None,
    ) -> set[Hashable]:
        """Ids of receivers selected by ``selector`` whose policy accepts sender+content."""
        groups = self._accepted_groups(sender or {}, content or {})
        if not groups:
            return set()
        candidates = None if selector is None else self._selected(selector)
        if candidates == 0:
            return set()
        ids = self._ids
        return {ids[slot] for slot in self._receivers_of(groups, candidates)}

    def selected(self, selector: Selector | str | None) -> set[Hashable]:
        """Ids of receivers the selector selects (policies not consulted)."""
        bits = self._live.bits if selector is None else self._selected(selector)
        return {self._ids[slot] for slot in members(bits)}

    def _accepted_groups(self, sender: Mapping[str, Any], content: Mapping[str, Any]) -> list[int]:
        key = _freeze(sender, content)
        cached = self._acceptance.get(key) if key is not None else None
        if cached is not None:
            self._acceptance.move_to_end(key)
            return cached
        accepted = self._evaluate_groups({SENDER: sender, EVENT: content})
        if key is not None:
            self._acceptance[key] = accepted
            if len(self._acceptance) > _ACCEPTANCE_CACHE:
                self._acceptance.popitem(last=False)
        return accepted

    def _evaluate_groups(self, scopes: Mapping[str, Any]) -> list[int]:
        self._refresh_index()
        assert self._index is not None
        positions = members(self._index.match(scopes))
        accepted = {self._index_groups[position] for position in positions}
        accepted.update(g for g in self._unindexed if self._groups[g].accepts(scopes))
        return [group for group in accepted if group in self._groups]

    def _refresh_index(self) -> None:
        """Rebuild the filter index when many groups are missing from it."""
        if self._index is not None and len(self._unindexed) <= max(8, len(self._groups) // 16):
            return
        filters: list[Filter] = []
        owners: list[int] = []
        for group, entry in self._groups.items():
            filters.extend(entry.filters)
            owners.extend([group] * len(entry.filters))
        self._index = FilterIndex(filters)
        self._index_groups = owners
        self._unindexed.clear()

    def _receivers_of(self, groups: list[int], candidates: int | None) -> list[int]:
        entries = [self._groups[group] for group in groups]
        accepted_count = sum(len(entry.members) for entry in entries)
        # Walking a member costs about as much as combining 8 kB of bitset:
        # small groups are walked, big ones combined as bitsets.
        union_cost = len(entries) * (WALK_PER_GROUP + len(self._ids) // 8192)
        if accepted_count <= max(FEW_RECEIVERS, union_cost):
            slots = [slot for entry in entries for slot in entry.members]
            if candidates is None:
                return slots
            table = membership_test_bytes(candidates)
            return [slot for slot in slots if has_slot(table, slot)]
        bits = self._union_of_groups(groups)
        return members(bits if candidates is None else bits & candidates)

    def _union_of_groups(self, groups: list[int]) -> int:
        if len(groups) * 2 > len(self._groups):
            # Most groups accept: subtract the refusing ones from everyone.
            accepted = set(groups)
            refusing = [g for g in self._groups if g not in accepted]
            return without(self._live.bits, _union(self._groups[g].bits.bits for g in refusing))
        return _union(self._groups[g].bits.bits for g in groups)

    # ------------------------------------------------------------------ selectors

    def _selector_filters(self, selector: Selector | str) -> list[Filter]:
        if isinstance(selector, str):
            selector = _parse_selector_cached(selector)
        filters = self._selectors.get(selector)
        if filters is None:
            if len(self._selectors) > 4096:
                self._selectors.clear()
            filters = self._selectors[selector] = selector.filters()
        return filters

    def _selected(self, selector: Selector | str) -> int:
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
        selector: Selector | str | None = None,
    ) -> Explanation:
        """Why ``match`` does or does not deliver this event to this receiver."""
        receiver = self.attributes(receiver_id)
        policy = self.policy(receiver_id)
        if isinstance(selector, str):
            selector = _parse_selector_cached(selector)
        return Explanation(
            receiver_id,
            selector is None,
            check_selector(selector, receiver),
            check_policy(policy, sender, content),
        )


def _union(bitsets: Iterable[int]) -> int:
    union = 0
    for bits in bitsets:
        union |= bits
    return union


def _freeze(sender: Mapping[str, Any], content: Mapping[str, Any]) -> Hashable | None:
    """Hashable key of a (sender, content) pair, or None if a value is unhashable."""
    try:
        # Types are part of the key: 1 and true are different attribute values.
        key = (
            frozenset((name, type(value), value) for name, value in sender.items()),
            frozenset((name, type(value), value) for name, value in content.items()),
        )
        hash(key)
    except TypeError:
        return None
    return key


_SELECTOR_CACHE: dict[str, Selector] = {}


def _parse_selector_cached(text: str) -> Selector:
    selector = _SELECTOR_CACHE.get(text)
    if selector is None:
        if len(_SELECTOR_CACHE) > 4096:
            _SELECTOR_CACHE.clear()
        selector = _SELECTOR_CACHE[text] = parse_selector(text)
    return selector


__all__ = ["Explanation", "Matcher", "Verdict"]
