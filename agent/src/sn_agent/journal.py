"""What the agent has done, kept in its state folder across restarts and crashes.

One SQLite database (the standard library's; WAL, synchronous=FULL: a committed write
survives SIGKILL and power loss). A delivery is written down *before* its action may
start and again when its outcome is known, so that an agent started again knows, for
every position it was handed, whether to run it, wait for it, or only answer it
(docs/agent.md, "Exactly once").
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, List, Optional

# How many answered deliveries are kept for `sn-agent status` and the record.
KEEP_ANSWERED = 1000

SCHEMA = """
CREATE TABLE IF NOT EXISTS deliveries (
    position INTEGER PRIMARY KEY,
    delivery INTEGER NOT NULL,
    event TEXT NOT NULL,
    sender INTEGER,
    channel TEXT,
    action TEXT,                       -- NULL: a notification without an action
    state TEXT NOT NULL,               -- noted | started | done
    status TEXT,                       -- ok | failed, once done
    result TEXT,                       -- JSON, once done
    answered INTEGER NOT NULL DEFAULT 0,
    boot TEXT,                         -- the boot the action started in
    taken_at REAL NOT NULL,
    done_at REAL
);
CREATE TABLE IF NOT EXISTS facts (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS deliveries_by_event ON deliveries (event);
-- Every event handed over whose seal held, until it could no longer be acted on
-- anyway (its signed lifetime and the clock margin): the deliveries above are pruned
-- by count, and a replay must not outlive the memory of it.
CREATE TABLE IF NOT EXISTS events (
    event TEXT PRIMARY KEY,
    position INTEGER NOT NULL,
    until REAL NOT NULL                -- Unix time
);
CREATE INDEX IF NOT EXISTS events_by_until ON events (until);
"""
# When this journal began remembering (a fact): an event signed before it may have
# been handed to an earlier journal (a wiped or replaced state folder).
MEMORY_SINCE = "memory_since"
# The agent's own attributes when this journal began (a fact, set once).
ATTRIBUTES_SINCE = "attributes_since"


@dataclass(frozen=True)
class Entry:
    """One delivery as the journal has it."""

    position: int
    delivery: int
    event: str
    action: Optional[str]
    state: str
    status: Optional[str]
    result: Optional[dict]
    answered: bool
    boot: Optional[str]
    taken_at: float
    done_at: Optional[float]


class StateInUse(Exception):
    """Another agent process uses this state folder (two copies would run every action
    twice)."""


class Journal:
    """The agent's durable record, in `state_dir/journal.sqlite3`. Opened for writing,
    it holds `state_dir/lock` for as long as it is open: one agent per state folder."""

    def __init__(self, state_dir: Path, *, read_only: bool = False) -> None:
        path = Path(state_dir) / "journal.sqlite3"
        self.lock_fd: Optional[int] = None
        if read_only:
            uri = f"file:{path}?mode=ro"
            self.db = sqlite3.connect(uri, uri=True, isolation_level=None, timeout=5)
            return
        self.lock_fd = _lock(Path(state_dir) / "lock")
        self.db = sqlite3.connect(str(path), isolation_level=None, timeout=5)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.execute("PRAGMA cache_size=-256")  # KiB: the journal is small
        self.db.executescript(SCHEMA)
        # A journal made now, or by a release that kept no memory of events: what was
        # handed over before this moment is unknown to it.
        self.db.execute(
            "INSERT OR IGNORE INTO facts (name, value) VALUES (?, ?)",
            (MEMORY_SINCE, json.dumps(time.time())),
        )
        self._memory_since: float = self.facts()[MEMORY_SINCE]

    def close(self) -> None:
        self.db.close()
        if self.lock_fd is not None:
            os.close(self.lock_fd)  # and with it the lock

    def position(self) -> Optional[int]:
        """The last position handed to this agent's application, or None if none."""
        row = self.db.execute("SELECT max(position) FROM deliveries").fetchone()
        return row[0]

    def note(
        self,
        notification,
        *,
        action: Optional[str],
        state: str,
        boot: str = "",
        remember_until: Optional[float] = None,
    ) -> None:
        """Write a delivery down as taken: `started` (its action may run from now on)
        or `noted` (nothing to run); with `remember_until`, its event is remembered
        until then, in the same transaction (one synchronous write)."""
        with self._transaction():
            self.db.execute(
                "INSERT OR REPLACE INTO deliveries (position, delivery, event, sender, channel,"
                " action, state, boot, taken_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    notification.position,
                    notification.delivery,
                    notification.event,
                    notification.sender,
                    notification.channel,
                    action,
                    state,
                    boot or None,
                    time.time(),
                ),
            )
            if remember_until is not None:
                self.db.execute(
                    "INSERT OR IGNORE INTO events (event, position, until) VALUES (?, ?, ?)",
                    (notification.event, notification.position, remember_until),
                )

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    def finish(self, position: int, status: str, result: dict) -> None:
        """Write down a delivery's outcome (its answer is still to be sent)."""
        self.db.execute(
            "UPDATE deliveries SET state = 'done', status = ?, result = ?, done_at = ?"
            " WHERE position = ?",
            (status, json.dumps(result), time.time(), position),
        )

    def answered(self, position: int) -> None:
        """The server has this delivery's answer."""
        self.db.execute("UPDATE deliveries SET answered = 1 WHERE position = ?", (position,))

    def earlier_position_of(self, event: str, position: int) -> Optional[int]:
        """The position at which this event was handed over before, if it was (an
        event delivered again under another position is not acted on twice): from
        the events remembered, or the deliveries kept."""
        row = self.db.execute(
            "SELECT position FROM events WHERE event = ? AND position != ?"
            " UNION ALL"
            " SELECT position FROM deliveries WHERE event = ? AND position != ? LIMIT 1",
            (event, position, event, position),
        ).fetchone()
        return row[0] if row else None

    def memory_since(self) -> float:
        """When this journal began remembering what it was handed (Unix time)."""
        return self._memory_since

    def attributes_since(self) -> Optional[dict]:
        """The agent's own attributes when this journal began, if written down."""
        return self.facts().get(ATTRIBUTES_SINCE)

    def set_attributes_since(self, attributes: dict) -> None:
        """Write down the agent's own attributes as this journal begins (once)."""
        self.db.execute(
            "INSERT OR IGNORE INTO facts (name, value) VALUES (?, ?)",
            (ATTRIBUTES_SINCE, json.dumps(attributes)),
        )

    def unfinished(self) -> List[Entry]:
        """Deliveries whose action started and whose outcome is not written down."""
        return self._entries("WHERE state = 'started' ORDER BY position")

    def unanswered(self) -> List[Entry]:
        """Deliveries with an outcome the server may not have yet."""
        return self._entries("WHERE state = 'done' AND answered = 0 ORDER BY position")

    def latest(self, count: int) -> List[Entry]:
        """The last `count` deliveries, newest first."""
        return self._entries("ORDER BY position DESC LIMIT ?", (count,))

    def prune(self, *, now: Optional[float] = None) -> None:
        """Forget answered deliveries beyond the newest KEEP_ANSWERED (the newest one
        stays in any case: it holds the position), and the events that could no
        longer be acted on anyway."""
        now = time.time() if now is None else now
        self.db.execute("DELETE FROM events WHERE until < ?", (now,))
        self.db.execute(
            "DELETE FROM deliveries WHERE (answered = 1 OR state = 'noted') AND position <"
            " (SELECT min(position) FROM (SELECT position FROM deliveries"
            "  ORDER BY position DESC LIMIT ?))",
            (KEEP_ANSWERED,),
        )

    def set_fact(self, name: str, value: Any) -> None:
        """Keep a small fact for `sn-agent status` (connected, pid...), as JSON."""
        self.db.execute(
            "INSERT OR REPLACE INTO facts (name, value) VALUES (?, ?)", (name, json.dumps(value))
        )

    def facts(self) -> dict:
        return {name: json.loads(value) for name, value in self.db.execute("SELECT * FROM facts")}

    def _entries(self, where: str, params: tuple = ()) -> List[Entry]:
        columns = "position, delivery, event, action, state, status, result, answered, boot,"
        rows = self.db.execute(
            f"SELECT {columns} taken_at, done_at FROM deliveries {where}", params
        )
        return [_entry(row) for row in rows]


def _lock(path: Path) -> int:
    """Hold an exclusive lock on `path` (released when the process ends, however)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise StateInUse(f"another sn-agent (pid {holder}) uses {path.parent}") from None
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    return fd


def _entry(row: tuple) -> Entry:
    values = list(row)
    values[6] = json.loads(values[6]) if values[6] is not None else None
    values[7] = bool(values[7])
    return Entry(*values)
