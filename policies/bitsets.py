"""Sets of small non-negative integers as Python ints (bit i set = member i).

CPython's big-int ``|``, ``&`` and ``^`` run in C over 30-bit digits, so a set
of a million receivers costs 125 kB and combining two takes microseconds.
``a & ~b`` is avoided: negative ints take a slow path; ``a ^ (a & b)`` is
the fast spelling of "a minus b".
"""

from __future__ import annotations

from collections.abc import Iterable

from gmpy2 import xmpz


def from_slots(slots: Iterable[int]) -> int:
    """The bitset with exactly the given members."""
    if not hasattr(slots, "__len__"):
        slots = list(slots)
    if not slots:
        return 0
    buffer = bytearray((max(slots) >> 3) + 1)
    for slot in slots:
        buffer[slot >> 3] |= 1 << (slot & 7)
    return int.from_bytes(buffer, "little")


def without(bits: int, removed: int) -> int:
    """Members of ``bits`` not in ``removed``."""
    return bits ^ (bits & removed)


def members(bits: int) -> list[int]:
    """Sorted members of a bitset.

    GMP walks the set bits in C (gmpy2's ``iter_set``): 3 to 8 times faster than the
    fastest pure-Python way for each shape (peeling bits off the top, visiting 64-bit
    words, scanning binary text): 23 members of 1,000 bits in 0.7 us against 2.6;
    10,000 of 1,000,000 in 0.36 ms against 2.5."""
    if not bits:
        return []
    return list(xmpz(bits).iter_set())


def membership_test_bytes(bits: int) -> bytes:
    """Little-endian bytes of ``bits`` for O(1) tests with ``has_slot``."""
    return bits.to_bytes((bits.bit_length() + 7) // 8, "little")


def has_slot(table: bytes, slot: int) -> bool:
    """Is ``slot`` a member, given ``membership_test_bytes(bits)``?"""
    index = slot >> 3
    return index < len(table) and bool(table[index] >> (slot & 7) & 1)


class PendingBits:
    """A bitset kept up to date lazily: changes are queued and applied in bulk.

    Setting one bit of a million-bit int copies 125 kB, so adding receivers
    one by one would be quadratic; queued changes are applied in one pass
    when the bitset is next read.
    """

    __slots__ = ("_added", "_bits", "_removed")

    def __init__(self) -> None:
        self._bits = 0
        self._added: set[int] = set()
        self._removed: set[int] = set()

    def add(self, slot: int) -> None:
        """Queue ``slot`` for insertion."""
        self._removed.discard(slot)
        self._added.add(slot)

    def discard(self, slot: int) -> None:
        """Queue ``slot`` for removal."""
        self._added.discard(slot)
        self._removed.add(slot)

    @property
    def bits(self) -> int:
        """The current bitset (applies queued changes)."""
        if self._removed:
            self._bits = without(self._bits, from_slots(self._removed))
            self._removed = set()
        if self._added:
            self._bits |= from_slots(self._added)
            self._added = set()
        return self._bits
