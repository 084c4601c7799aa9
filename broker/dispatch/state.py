"""Per-process dispatcher state, rebuilt from PostgreSQL and kept fresh from its logs.

Each worker process holds, for the dispatchers it serves: the tree's shape, for each
leaf a `Matcher` over its receivers (refreshed from the `ClientChange` log before every
use), and cached copies of subtree summaries (refreshed when their version moves).
Nothing here is authoritative: losing a process loses nothing.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from django.db import DatabaseError, connection
from django.utils import timezone

from broker.dispatch.summary import Summary
from broker.models import (
    AttributeValue,
    Client,
    ClientChange,
    Dispatcher,
    DispatcherSummary,
    PolicyVersion,
)
from broker.prepared import int_array, plan_once, prepared_cursor
from broker.reads.clients import LogRead, clients_changed_since, snapshot_xmin
from broker.vocabulary import FRESH_FOR_S, STAMP_COLUMNS, Vocabulary, vocabulary, vocabulary_at
from policies import Matcher, Policy

log = logging.getLogger(__name__)

# A changed receiver as the leaf held it before the change: its attributes and policy;
# None where that is unknown (the state was built afresh) or it was no receiver here.
Before = tuple[dict[str, Any], Policy] | None


@dataclass
class Topology:
    """The tree's shape: parents, children and leaves by dispatcher id."""

    parent: dict[int, int | None] = field(default_factory=dict)
    children: dict[int, list[int]] = field(default_factory=dict)
    leaves: set[int] = field(default_factory=set)
    queues: dict[int, str] = field(default_factory=dict)

    @classmethod
    def load(cls) -> Topology:
        topology = cls()
        for node in Dispatcher.objects.order_by("id"):
            topology.parent[node.id] = node.parent_id
            topology.children.setdefault(node.id, [])
            topology.queues[node.id] = node.queue
            if node.parent_id is not None:
                topology.children.setdefault(node.parent_id, []).append(node.id)
            if node.is_leaf:
                topology.leaves.add(node.id)
        return topology


_topology: Topology | None = None


def topology(dispatcher_id: int | None = None) -> Topology:
    """The cached topology, reloaded when it does not know `dispatcher_id`."""
    global _topology
    if _topology is None or (dispatcher_id is not None and dispatcher_id not in _topology.parent):
        _topology = Topology.load()
    return _topology


def queue_of(dispatcher_id: int) -> str:
    """The Celery queue of a dispatcher."""
    return topology(dispatcher_id).queues[dispatcher_id]


class LeafState:
    """The receivers attached to one leaf, in a Matcher, as of `last_change`."""

    def __init__(self, dispatcher_id: int) -> None:
        self.dispatcher_id = dispatcher_id
        self.matcher = Matcher()
        self.horizon = snapshot_xmin()
        self.last_read = LogRead.now()
        # The clients changed since this process last saw the stored summary cover
        # them; None: all of them (a state built afresh).
        self.unsummarised: set[int] | None = None
        self.reload(Client.objects.filter(dispatcher_id=dispatcher_id).values_list("id", flat=True))

    def refresh(self) -> dict[int, Before]:
        """Apply changes not surely seen before; return the changed client ids, each
        with the receiver it was before.

        Changes whose transaction id is at or above the previous horizon are read again
        (reloading a client twice is harmless); below it, every change was committed
        before the previous read and so was seen then.
        """
        return self.advance(
            *clients_changed_since(self.horizon, [self.dispatcher_id], last=self.last_read)
        )

    def advance(self, horizon: int, changed: set[int]) -> dict[int, Before]:
        """Move to `horizon`, reading the changed clients again; return them, each with
        the receiver it was before."""
        self.horizon, self.last_read = horizon, LogRead.now()
        before = {client_id: self.held_as(client_id) for client_id in changed}
        if self.unsummarised is not None:
            self.unsummarised |= changed
        if changed:
            self.reload(changed)
        return before

    def held_as(self, client_id: int) -> Before:
        """The client as a receiver here (attributes, policy); None if it is none."""
        if client_id not in self.matcher:
            return None
        return self.matcher.attributes(client_id), self.matcher.policy(client_id)

    def reload(self, client_ids: Iterable[int]) -> None:
        """Read these clients again (those no longer receivers here leave)."""
        ids = list(client_ids)
        receivers = _receivers(self.dispatcher_id, ids)
        for client_id in ids:
            found = receivers.get(client_id)
            if found is None:
                if client_id in self.matcher:
                    self.matcher.remove(client_id)
            elif client_id in self.matcher:
                self.matcher.update(client_id, found[0], found[1])
            else:
                self.matcher.add(client_id, found[0], found[1])

    def receivers(self) -> Iterable[tuple[dict[str, Any], Policy]]:
        for client_id in self.matcher.selected(None):
            yield self.matcher.attributes(client_id), self.matcher.policy(client_id)

    def summary(self) -> Summary:
        return Summary.of_receivers(self.receivers())

    def unsummarised_summary(self) -> Summary | None:
        """The summary of the receivers changed since `summarised` (None: unknown, a
        state built afresh): if the stored summary covers it, it covers the leaf's,
        without a pass over every receiver of the leaf at every change."""
        if self.unsummarised is None:
            return None
        changed = (c for c in self.unsummarised if c in self.matcher)
        return Summary.of_receivers(
            (self.matcher.attributes(c), self.matcher.policy(c)) for c in changed
        )

    def summarised(self) -> None:
        """The stored summary covers every receiver as this state holds it."""
        self.unsummarised = set()


# The clients given that can receive at this leaf now, each with its newest policy's
# text and its live attributes, in one statement: a leaf's pass under a fleet's load
# reports reads a few clients a second, and three ORM queries built for each pass were
# a third of an idle tree worker. Live: neither revoked nor expired (as
# broker.reads.clients.live_attribute_values). With the vocabulary's stamp, read in the
# same statement as the policies it types (`vocabulary_at`).
RECEIVERS = f"""
SELECT c.id, p.canonical_text,
       coalesce((SELECT jsonb_object_agg(a.name, a.value)
                 FROM {AttributeValue._meta.db_table} a
                 WHERE a.client_id = c.id AND a.revoked_at IS NULL
                   AND (a.expires_at IS NULL OR a.expires_at > %(now)s)), '{{}}')::text,
       {STAMP_COLUMNS}
FROM {Client._meta.db_table} c
CROSS JOIN LATERAL (
    SELECT canonical_text FROM {PolicyVersion._meta.db_table}
    WHERE client_id = c.id ORDER BY version DESC LIMIT 1
) p
WHERE c.id = ANY(%(clients)s::bigint[]) AND c.dispatcher_id = %(leaf)s
  AND c.is_active AND c.can_receive
"""


def _receivers(dispatcher_id: int, client_ids: list[int]) -> dict[int, tuple[dict, Policy]]:
    """{client id: (attributes, policy)} of those clients that can receive here now. A
    receiver without a policy accepts nothing, so it is simply not a receiver yet."""
    if not client_ids:
        return {}
    parameters = {"clients": int_array(client_ids), "leaf": dispatcher_id, "now": timezone.now()}
    with prepared_cursor() as cursor:
        cursor.execute(RECEIVERS, parameters)
        rows = cursor.fetchall()
    if not rows:
        return {}
    # Parsed with the vocabulary, once per distinct text (most receivers share one).
    words = vocabulary_at(rows[0][3:])
    return {
        client_id: (json.loads(attributes), words.stored_policy(text))
        for client_id, text, attributes, *_ in rows
    }


_leaves: dict[int, LeafState] = {}


# Serialises delivery at one leaf, whichever process serves it (a transaction lock).
LEAF_LOCK_NAMESPACE = 7_101

# The leaf's lock, the snapshot's horizon and the clients changed since the last one,
# in one statement: a round trip less on every hop that delivers. Both reads use the
# statement's snapshot, taken before the lock was granted: a change committed while it
# waited is at or above the new horizon, so it is read next time (as one committed
# just after the read always was); later statements see everything before the lock.
# The lock lasts until the transaction ends (`pg_advisory_xact_lock`) or, held by the
# session, until it is released (`pg_advisory_lock`, `leaf_held`).
_LOCK_AND_CHANGES = f"""
SELECT {{lock}}(%s, %s)::text,
       pg_snapshot_xmin(pg_current_snapshot())::text::bigint,
       ARRAY(SELECT client_id FROM {ClientChange._meta.db_table}
             WHERE dispatcher_id = %s AND txid >= %s AND at >= %s)
"""
LOCK_AND_CHANGES = _LOCK_AND_CHANGES.format(lock="pg_advisory_xact_lock")
HOLD_AND_CHANGES = _LOCK_AND_CHANGES.format(lock="pg_advisory_lock")
RELEASE = "SELECT pg_advisory_unlock(%s, %s)"


def locked_leaf_state(dispatcher_id: int) -> tuple[LeafState, dict[int, Before]]:
    """Take the leaf's lock (until the transaction ends); return its fresh state and
    the clients changed since it was last used, each with the receiver it was before.

    A state built afresh reports all its receivers as changed, from unknown: whatever
    happened while no process held it, they must be caught up on the live events they
    now match.
    """
    return _fresh_state(dispatcher_id, *_lock(dispatcher_id, LOCK_AND_CHANGES))


@contextmanager
def leaf_held(dispatcher_id: int) -> Iterator[tuple[LeafState, dict[int, Before]]]:
    """`locked_leaf_state` outside a transaction: the lock is the session's, held until
    the block ends, and every statement in the block commits on its own. Delivering
    then costs no BEGIN and no COMMIT round trip; what the lock guarantees (one
    process delivers at a leaf at a time, and sees what the one before it wrote) holds
    as well, since each write commits before the lock is released."""
    if connection.in_atomic_block:
        raise RuntimeError("a session's lock must not be taken inside a transaction")
    plan_once()
    locked = _lock(dispatcher_id, HOLD_AND_CHANGES)
    try:
        yield _fresh_state(dispatcher_id, *locked)
    finally:
        _release(dispatcher_id)


def _lock(dispatcher_id: int, statement: str) -> tuple[int, list[int]]:
    state = _leaves.get(dispatcher_id)
    horizon = state.horizon if state is not None else 0
    # A state built afresh reads no change (_fresh_state): any moment will do then.
    since = (state.last_read if state is not None else LogRead.now()).since
    parameters = [LEAF_LOCK_NAMESPACE, dispatcher_id, dispatcher_id, horizon, since]
    with prepared_cursor() as cursor:
        cursor.execute(statement, parameters)
        _, following, changed = cursor.fetchone()
    return following, changed


def _fresh_state(
    dispatcher_id: int, following: int, changed: list[int]
) -> tuple[LeafState, dict[int, Before]]:
    state = _leaves.get(dispatcher_id)
    if state is None or state.last_read.stale():
        state = _leaves[dispatcher_id] = LeafState(dispatcher_id)
        return state, dict.fromkeys(state.matcher.selected(None))
    return state, state.advance(following, set(changed))


def _release(dispatcher_id: int) -> None:
    try:
        with prepared_cursor() as cursor:
            cursor.execute(RELEASE, [LEAF_LOCK_NAMESPACE, dispatcher_id])
    except DatabaseError:
        # Unreleased, the lock would stop every process delivering at this leaf for as
        # long as the connection lives: ending the connection surely releases it.
        log.exception("releasing leaf %s's lock failed; closing the connection", dispatcher_id)
        connection.close()


def forget_leaf(dispatcher_id: int) -> None:
    """Drop a leaf's state after a failed transaction: memory must not run ahead of
    the database, so the next use rebuilds it (and catches every receiver up)."""
    _leaves.pop(dispatcher_id, None)


_summaries: dict[int, tuple[int, Vocabulary, Summary]] = {}
_summaries_read_at: dict[int, float] = {}


def routing_summaries(dispatcher_ids: list[int]) -> dict[int, Summary]:
    """`summaries_of`, as read at most FRESH_FOR_S ago: what routing uses."""
    now = time.monotonic()
    if all(now - _summaries_read_at.get(d, -FRESH_FOR_S) < FRESH_FOR_S for d in dispatcher_ids):
        return {d: _summaries[d][2] if d in _summaries else Summary() for d in dispatcher_ids}
    found = summaries_of(dispatcher_ids)
    for dispatcher_id in dispatcher_ids:
        _summaries_read_at[dispatcher_id] = now
    return found


def summaries_of(dispatcher_ids: list[int]) -> dict[int, Summary]:
    """Stored summaries of these dispatchers (an empty one where none is stored yet),
    their policies typed by the current vocabulary."""
    versions = dict(
        DispatcherSummary.objects.filter(dispatcher_id__in=dispatcher_ids).values_list(
            "dispatcher_id", "version"
        )
    )
    words = vocabulary()
    stale = [d for d, v in versions.items() if _summaries.get(d, (None, None))[:2] != (v, words)]
    rows = list(DispatcherSummary.objects.filter(dispatcher_id__in=stale))
    if rows:
        # Read again after the rows: whatever names they use were committed before them.
        words = vocabulary()
    for row in rows:
        _summaries[row.dispatcher_id] = (row.version, words, Summary.from_json(row.data, words))
    return {d: _summaries[d][2] if d in versions else Summary() for d in dispatcher_ids}
