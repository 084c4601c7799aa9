"""Deliveries by the million, as the leaves would have written them and the agents
would have confirmed and answered them.

Receivers are taken in blocks (by id); a block's deliveries are written by COPY in one
transaction that also moves the blocks' streams, each receiver's positions continuing
its stream without a gap. Rows go in receiver order, which keeps every index of the
table written near where it was last written (the receiver's indexes grow at one end,
the event's at a few hundred places), the difference between minutes and an hour for
ten million rows. The answers' audit entries are made from the committed rows on a
second connection while the next block is written.
"""

from __future__ import annotations

import json
import math
import random
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from django.db import connection, transaction

from broker.audit import authentication_code
from broker.models import AuditEntry, Client, Delivery, ReceiverStream
from demo.bulk import NULL, copy_escape, copy_rows, copy_text
from demo.synthetic.clock import MS, US, Stamps, to_datetime
from demo.synthetic.incident import Fate, behaviour
from demo.synthetic.records import DONE, ENTRY_FIELDS
from demo.synthetic.roster import Fleet, Receiver

# Deliveries per block (one transaction): at least eight blocks to share between the
# lanes, and as few as that. Each block's answers are audited in time order, which
# walks the audit log's time-ordered indexes end to end once per block.
BLOCKS = 8
SMALLEST_BLOCK, LARGEST_BLOCK = 50_000, 1_000_000
LANES = 2  # blocks written at once (the machine this was sized on has two cores)
LINES_PER_BLOCK = 20_000  # lines handed to COPY at once
POOL = 1 << 16


@dataclass(frozen=True)
class Answer:
    """How receivers answer one kind of event: the typical delay after receipt, how
    often it fails and with what, and what a success says after the host's name (None:
    the host's status)."""

    median_s: float
    failing: float
    output: str | None
    error: dict


ANSWERS = {
    "alert": Answer(2, 0.002, ": alert noted", {"exit_code": 1, "error": "handler crashed"}),
    "disable-cgi": Answer(
        20, 0.04, ": CGI disabled", {"exit_code": 1, "error": "iisreset exited 1"}
    ),
    "shutdown": Answer(
        15, 0.02, ": web server stopped", {"exit_code": 1, "error": "iisreset /stop exited 1"}
    ),
    "patch": Answer(
        180, 0.06, ": patched to 2.4.9", {"exit_code": 1603, "error": "msiexec exited 1603"}
    ),
    "status": Answer(3, 0.005, None, {"exit_code": 124, "error": "status timed out"}),
    "report": Answer(2, 0.0, ": report noted", {"exit_code": 1, "error": "handler crashed"}),
}
OK_HEAD = '{"exit_code": 0, "output": "'
DELIVERY_FIELDS = [
    "event", "receiver", "sender", "channel", "sequence", "expires_at", "position", "state",
    "delivered_at", "received_at", "acked_at", "result",
]  # fmt: skip


@dataclass(frozen=True)
class EventLine:
    """What all the deliveries of one event share, ready for COPY lines."""

    head: str  # event id and a tab
    middle: str  # sender, channel, sequence and the event's expiry between tabs
    arrivals: dict[int, int]  # leaf: when the event reached it
    expires: int
    answer_us: float  # the answer's median delay
    failing: float
    ok_tail: str | None
    failed: str

    @classmethod
    def of(cls, event) -> EventLine:
        answer = ANSWERS.get(event.send.action, ANSWERS["alert"])
        channel = copy_escape(event.send.channel)
        tail = answer.output and copy_escape(json.dumps(answer.output)[1:-1]) + '"}'
        expiry = to_datetime(event.expires_at).isoformat()
        return cls(
            f"{event.id}\t",
            f"\t{event.sender.id}\t{channel}\t{event.sequence}\t{expiry}\t",
            event.route.arrivals, event.expires_at, answer.median_s * US, answer.failing,
            tail, copy_escape(json.dumps(answer.error)),
        )  # fmt: skip


class Pools:
    """Random delays drawn once and picked at random: a lognormal draw per delivery
    would cost more than the rest of its line."""

    def __init__(self, rng: random.Random) -> None:
        def lognormal(median: float, sigma: float) -> list[float]:
            return [median * math.exp(rng.gauss(0, sigma)) for _ in range(POOL)]

        self.jitter = [round(x) for x in lognormal(2 * MS, 0.8)]  # within a leaf's batch
        self.confirm = [round(x) for x in lognormal(150 * MS, 0.9)]  # pushed and confirmed
        # Answers: a heavy tail, now and then ten times longer (a slow command).
        self.answer = [x * (10 if rng.random() < 0.03 else 1) for x in lognormal(1.0, 1.0)]
        self._confirm_scaled: dict[float, list[int]] = {1.0: self.confirm}

    def confirm_scaled(self, factor: float) -> list[int]:
        """The confirmation delays of a region `factor` times slower."""
        if factor not in self._confirm_scaled:
            self._confirm_scaled[factor] = [round(factor * delay) for delay in self.confirm]
        return self._confirm_scaled[factor]


class _Receiving:
    """One receiver's deliveries in this run: its stream's numbering, what it confirms
    (cumulative: once one is unconfirmed, none after it is) and how it answers."""

    def __init__(self, writer: DeliveryWriter, rng: random.Random, receiver: Receiver, start):
        self.writer = writer
        self.bits, self.random = rng.getrandbits, rng.random
        self.id, self.leaf = str(receiver.id), receiver.leaf
        self.name = copy_escape(json.dumps(receiver.name)[1:-1])
        attributes = dict(receiver.attributes)
        self.status = copy_escape(json.dumps(f": {_status_of(attributes)}")[1:-1]) + '"}'
        pace = behaviour(attributes.get("region"))
        self.confirm, self.answer, self.failing = pace.confirm, pace.answer, pace.failing
        fate = writer.fates.get(receiver.id) or Fate()
        self.off, self.back, self.hung = fate.off, fate.back, fate.hung
        self.position, self.confirmed = start
        # An earlier run left it unconfirmed: it is still offline.
        self.confirming = self.confirmed == self.position
        self.last_delivered = self.last_received = 0
        self.steady = self.confirming and fate == Fate()

    def lines(self, events: list[EventLine], indices: list[int]) -> list[str]:
        """The lines of its deliveries of these events, in order."""
        done = self._steady_lines(events, indices) if self.steady else []
        return done + [self.line(events[index]) for index in indices[len(done) :]]

    def _steady_lines(self, events: list[EventLine], indices: list[int]) -> list[str]:
        """Lines of deliveries confirmed and answered, as long as they are (nothing goes
        wrong with most receivers; those too stop answering when the present comes).
        The hot loop of ten million rows: one function, locals only, the timestamps'
        text made inline (every moment here lies between the incident's start and now)."""
        writer = self.writer
        now, bits, random = writer.now, self.bits, self.random
        heads, first, micros = writer.stamps.heads, writer.stamps.first, writer.stamps.micros
        jitter, answers = writer.pools.jitter, writer.pools.answer
        confirm = writer.pools.confirm_scaled(self.confirm)
        ident, leaf, name, status = self.id, self.leaf, self.name, self.status
        failing, pace = self.failing, self.answer
        position, last_delivered, last_received, lines = self.position, 0, 0, []
        for index in indices:
            event = events[index]
            delivered = event.arrivals[leaf] + jitter[bits(16)]
            if delivered <= last_delivered:
                delivered = last_delivered + 1
            received = delivered + confirm[bits(16)]
            if received < last_received:
                received = last_received
            acked = received + int(event.answer_us * pace * answers[bits(16)])
            if acked > now:
                break
            last_delivered, last_received, position = delivered, received, position + 1
            if random() < event.failing * failing:
                state, result = "failed", event.failed
            else:
                state, result = "acked", f"{OK_HEAD}{name}{event.ok_tail or status}"
            lines.append(
                f"{event.head}{ident}{event.middle}{position}\t{state}\t"
                f"{heads[delivered // US - first]}.{micros[delivered % US]}+00\t"
                f"{heads[received // US - first]}.{micros[received % US]}+00\t"
                f"{heads[acked // US - first]}.{micros[acked % US]}+00\t{result}\n"
            )
        self.position = self.confirmed = position
        self.last_delivered, self.last_received = last_delivered, last_received
        return lines

    def line(self, event: EventLine) -> str:
        self.position += 1
        delivered = self._delivered_at(event)
        received = self._received_at(delivered)
        stamp = self.writer.stamps.text
        if received is None:
            state = "pending" if event.expires > self.writer.now else "expired"
            tail = f"{state}\t{stamp(delivered)}\t{NULL}\t{NULL}\t{NULL}"
        else:
            state, answer = self._answer(event, received)
            tail = f"{state}\t{stamp(delivered)}\t{stamp(received)}\t{answer}"
        return f"{event.head}{self.id}{event.middle}{self.position}\t{tail}\n"

    def _delivered_at(self, event: EventLine) -> int:
        moment = event.arrivals[self.leaf] + self.writer.pools.jitter[self.bits(16)]
        self.last_delivered = moment = max(moment, self.last_delivered + 1)
        return moment

    def _received_at(self, delivered: int) -> int | None:
        if not self.confirming:
            return None
        delay = self.writer.pools.confirm[self.bits(16)]
        if self.off is not None and self.off <= delivered and (self.back or math.inf) > delivered:
            moment = self.back and self.back + delay  # confirms all it missed on its return
        else:
            moment = delivered + round(self.confirm * delay)
        if moment is None or moment > self.writer.now:
            self.confirming = False
            return None
        self.last_received = moment = max(moment, self.last_received)
        self.confirmed = self.position
        return moment

    def _answer(self, event: EventLine, received: int) -> tuple[str, str]:
        """(state, the acked_at and result columns) of a delivery received then."""
        if self.hung is not None and received >= self.hung:
            return "delivered", f"{NULL}\t{NULL}"
        pools, bits = self.writer.pools, self.bits
        acked = received + round(event.answer_us * self.answer * pools.answer[bits(16)])
        if acked > self.writer.now:
            return "delivered", f"{NULL}\t{NULL}"
        stamp = self.writer.stamps.text(acked)
        if self.random() < event.failing * self.failing:
            return "failed", f"{stamp}\t{event.failed}"
        output = event.ok_tail or self.status
        return "acked", f"{stamp}\t{OK_HEAD}{self.name}{output}"


def _status_of(attributes: dict) -> str:
    """What a server's status command reports, in a line."""
    described = [str(attributes.get(name, "")) for name in ("software", "version")]
    cgi = attributes.get("cgi")
    if cgi is not None:
        described.append(f"cgi {'on' if cgi else 'off'}")
    return " ".join(part for part in described if part) or "up"


ENSURE_STREAMS = f"""
INSERT INTO {ReceiverStream._meta.db_table} (client_id, last_position, confirmed_position)
SELECT unnest(%s::bigint[]), 0, 0
ON CONFLICT (client_id) DO NOTHING
"""
LOCK_STREAMS = f"""
SELECT client_id, last_position, confirmed_position FROM {ReceiverStream._meta.db_table}
WHERE client_id = ANY(%s) ORDER BY client_id FOR UPDATE
"""
MOVE_STREAMS = f"""
UPDATE {ReceiverStream._meta.db_table} AS stream
SET last_position = moved.last, confirmed_position = moved.confirmed
FROM unnest(%s::bigint[], %s::bigint[], %s::bigint[]) AS moved(client_id, last, confirmed)
WHERE stream.client_id = moved.client_id
"""
# The answers as broker.services.deliveries audits each one, read from the rows as
# written; their entries are made (with their authentication codes) in Python.
ANSWERS_TO_AUDIT = f"""
SELECT d.acked_at, 'client:' || c.name, 'event:' || d.event_id, d.id, d.state
FROM unnest(%s::bigint[], %s::bigint[]) AS s(receiver_id, after)
JOIN {Delivery._meta.db_table} AS d ON d.receiver_id = s.receiver_id AND d.position > s.after
JOIN {Client._meta.db_table} AS c ON c.id = d.receiver_id
WHERE d.state IN ('acked', 'failed')
ORDER BY d.acked_at
"""


class DeliveryWriter:
    """Writes the deliveries of planned events (routed and numbered) for a fleet.

    Blocks go to LANES threads, each with its connection and transaction, so that the
    database inserts on every core while Python makes the lines; a block's answers are
    audited once it is committed, by its lane's auditor (a thread and connection of its
    own, so that the lane goes on with its next block meanwhile). Each block draws from its own
    generator, seeded from `seed`: the same seed makes the same deliveries whichever
    lane runs first."""

    def __init__(self, events: list, fleet: Fleet, fates: dict[int, Fate], now: int, seed: int):
        self.lines = [EventLine.of(event) for event in events]
        self.fleet, self.fates, self.now, self.seed = fleet, fates, now, seed
        self.pools = Pools(random.Random(seed))
        self.stamps = Stamps(_first_moment(events))
        self.indices = _indices_by_receiver(events, fleet)

    def write(self, *, audit_answers: bool) -> int:
        """Write every delivery; return how many."""
        lanes = [ThreadPoolExecutor(max_workers=1) for _ in range(LANES)]
        auditors = [ThreadPoolExecutor(max_workers=1) for _ in range(LANES)]
        blocks = []
        for number, block in enumerate(self._blocks()):
            lane, auditor = lanes[number % LANES], auditors[number % LANES]
            auditor = auditor if audit_answers else None
            blocks.append(lane.submit(self._write_block, number, block, auditor))
        try:
            return _written(blocks)
        finally:
            for block in blocks:
                block.cancel()  # those not begun, after a failure
            for executor in (*lanes, *auditors):
                executor.submit(_close_connection)  # each thread's own, last
                executor.shutdown(wait=True)

    def _blocks(self):
        total = sum(len(indices) for indices in self.indices.values())
        chunk = min(LARGEST_BLOCK, max(SMALLEST_BLOCK, total // BLOCKS))
        block, size = [], 0
        for receiver in self.fleet.receivers:
            count = len(self.indices.get(receiver.id, ()))
            if count:
                block.append(receiver)
                size += count
            if size >= chunk:
                yield block
                block, size = [], 0
        if block:
            yield block

    def _write_block(self, number: int, block: list[Receiver], auditor: ThreadPoolExecutor | None):
        """(deliveries written, the audit of their answers if asked) of one block, in
        one transaction on this lane's connection."""
        rng = random.Random(f"{self.seed}:{number}")
        with transaction.atomic():
            _skip_reference_checks()
            starts = _locked_streams([r.id for r in block])
            receiving = [_Receiving(self, rng, r, starts[r.id]) for r in block]
            copy_text(Delivery, DELIVERY_FIELDS, self._text(receiving))
            _move_streams(receiving)
        audit = auditor.submit(_audit_answers, starts) if auditor else None
        return sum(len(self.indices[r.id]) for r in block), audit

    def _text(self, receiving: list[_Receiving]):
        lines = []
        for receiver in receiving:
            lines += receiver.lines(self.lines, self.indices[int(receiver.id)])
            if len(lines) >= LINES_PER_BLOCK:
                yield "".join(lines)
                lines = []
        yield "".join(lines)


def _written(blocks: list[Future]) -> int:
    """How many deliveries the blocks wrote, once they and their audits are done."""
    written, audits = 0, []
    for block in blocks:
        count, audit = block.result()
        written += count
        audits.append(audit)
    for audit in audits:
        if audit is not None:
            audit.result()
    return written


def _first_moment(events: list) -> int:
    return min((event.at for event in events), default=0)


def _indices_by_receiver(events: list, fleet: Fleet) -> dict[int, list[int]]:
    """{receiver id: indices of the events it receives, in time order}."""
    by_group: dict[int, list[int]] = {g.index: [] for g in fleet.groups}
    limited: dict[int, list[int]] = {}
    for index, event in enumerate(events):
        audience = event.audience
        accepted = [g for g, verdict in audience.verdicts.items() if verdict is None]
        if audience.recipients is None:
            for group in accepted:
                by_group[group].append(index)
            continue
        for receiver_id in audience.recipients:
            if fleet.group_of[receiver_id] in accepted:
                limited.setdefault(receiver_id, []).append(index)
    found = {}
    for receiver in fleet.receivers:
        indices = by_group[fleet.group_of[receiver.id]]
        extra = limited.get(receiver.id)
        found[receiver.id] = sorted(indices + extra) if extra else indices
    return found


def _skip_reference_checks() -> None:
    """Every row refers to a client and an event read or written just before, so the
    foreign keys' checks (three per row, at commit: as long again as the rest of the
    write) are skipped where the database lets us (a superuser, as the launcher's and
    the tests' are); the tests check the references instead."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('is_superuser') = 'on'")
        if cursor.fetchone()[0]:
            cursor.execute("SET LOCAL session_replication_role = replica")


def _locked_streams(ids: list[int]) -> dict[int, tuple[int, int]]:
    """{receiver: (last position, confirmed position)}, the streams locked until
    commit (the leaves' inserts wait: positions are handed out once)."""
    with connection.cursor() as cursor:
        cursor.execute(ENSURE_STREAMS, [ids])
        cursor.execute(LOCK_STREAMS, [ids])
        return {client: (last, confirmed) for client, last, confirmed in cursor.fetchall()}


def _move_streams(receiving: list[_Receiving]) -> None:
    columns = [[int(r.id) for r in receiving], [r.position for r in receiving],
               [r.confirmed for r in receiving]]  # fmt: skip
    with connection.cursor() as cursor:
        cursor.execute(MOVE_STREAMS, columns)


def _audit_answers(starts: dict[int, tuple[int, int]]) -> None:
    """The answers' audit entries of a committed block (on this thread's connection)."""
    receivers = list(starts)
    with transaction.atomic(), connection.cursor() as cursor:
        # A block's entries sorted by time in memory, not in files.
        cursor.execute("SET LOCAL work_mem = '256MB'")
        cursor.execute(ANSWERS_TO_AUDIT, [receivers, [starts[r][0] for r in receivers]])
        rows = [_answer_entry(*row) for row in cursor.fetchall()]
        copy_rows(AuditEntry, ENTRY_FIELDS, rows)


def _answer_entry(at, actor: str, target: str, delivery_id: int, state: str) -> tuple:
    details = {"delivery": delivery_id, "state": state}
    fields = {"at": at, "actor": actor, "action": "delivery.ack", "target": target,
              "outcome": DONE, "reason": ""}  # fmt: skip
    code = authentication_code(**fields, details=details)
    return (*fields.values(), json.dumps(details), code)


def _close_connection() -> None:
    """Close this thread's connection (the auditor's, once done)."""
    connection.close()
