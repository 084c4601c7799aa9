"""The login gate (broker.protocol.LoginGate): at most so many connections of a web
process waiting to log in; beyond, a refusal that says when to come back: a slot of its
own, at the rate logins finish."""

from __future__ import annotations

import random
import time

import pytest

from broker import protocol


class Clock:
    """A monotonic clock that moves only when told."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def logins_finishing(gate: protocol.LoginGate, clock: Clock, count: int, every_s: float):
    """`count` logins one after the other, each alone and taking `every_s`."""
    for _ in range(count):
        ticket = gate.arrive()
        clock.now += every_s
        gate.leave(ticket, logged_in=True)


def refused(gate: protocol.LoginGate) -> float:
    """Arrive at a full gate: the wait it asks for."""
    with pytest.raises(protocol.Busy) as busy:
        gate.arrive()
    assert busy.value.code == "busy"
    return busy.value.retry_after_s


def test_connections_beyond_the_limit_are_refused_as_busy_until_one_leaves():
    gate = protocol.LoginGate(2)
    first = gate.arrive()
    gate.arrive()
    refused(gate)
    gate.leave(first, logged_in=True)
    gate.arrive()
    assert gate.waiting == 2


def test_a_connection_that_goes_away_without_logging_in_frees_its_place():
    gate = protocol.LoginGate(1)
    gate.leave(gate.arrive(), logged_in=False)
    gate.arrive()
    assert gate.waiting == 1 and not gate.finished


def test_the_refusal_says_when_to_come_back_in_its_frame():
    frame = protocol.error_frame(protocol.Busy(2.5), "in")
    assert frame == {
        "type": "error",
        "ref": "in",
        "code": "busy",
        "message": "this console is logging in many agents at once: try again in 2.5 s",
        "field": None,
        "retry_after_s": 2.5,
    }


def test_a_crowd_of_refused_logins_is_booked_a_slot_each_at_the_rate_logins_finish():
    gate = protocol.LoginGate(1, clock=Clock())  # a crowd in one instant, however slow
    gate.arrive()
    waits = [refused(gate) for _ in range(4500)]
    # 4,500 refused at the assumed 1,000 logins a second, booked half again as fast: one
    # every 0.67 ms from a second on, in the order they were refused, the last three
    # seconds later.
    assert protocol.LoginGate.ASSUMED_RATE * protocol.LoginGate.PACE == 1500
    assert waits == sorted(waits)
    assert waits[0] == 1.1 and waits[-1] in (4.0, 4.1)
    assert waits[2249] in (2.5, 2.6)
    assert max(waits.count(w) for w in set(waits)) <= 151  # about 150 a tenth of a second


def test_slots_already_past_are_not_booked_again():
    gate = protocol.LoginGate(1)
    gate.arrive()
    gate.booked_until = time.monotonic() - 30.0  # an earlier crowd's, long logged in
    assert refused(gate) == 1.1


def test_a_crowd_beyond_a_minute_of_slots_is_spread_over_that_minute():
    # A clock that stands still: on a slow machine 30,000 refusals take seconds of real
    # time, and a slot's wait, counted from each refusal's own moment, would shrink.
    gate = protocol.LoginGate(0, clock=Clock(), rng=random.Random(7))
    waits = [refused(gate) for _ in range(100_000)]  # 59 s at 1,500 a second: 88,500
    booked, beyond = waits[:88_000], waits[89_000:]
    assert booked == sorted(booked) and max(booked) <= protocol.LoginGate.LONGEST_WAIT_S
    assert min(beyond) < 10.0 and max(beyond) > 50.0


def test_no_refusal_asks_for_more_than_a_minute():
    gate = protocol.LoginGate(0, clock=Clock())
    waits = [refused(gate) for _ in range(20_000)]
    assert max(waits) <= protocol.LoginGate.LONGEST_WAIT_S


def test_the_wait_follows_the_rate_logins_finish_at():
    clock = Clock()
    gate = protocol.LoginGate(1, clock=clock)
    logins_finishing(gate, clock, 50, every_s=0.025)  # one at a time: 40 a second
    gate.arrive()
    waits = [refused(gate) for _ in range(200)]
    # booked at 60 a second: the 200 refused over 3.3 seconds after the first.
    assert 1.0 + 3.2 <= max(waits) <= 1.0 + 3.5


def test_a_crowd_let_in_at_once_is_measured_at_the_rate_it_is_logged_in():
    # 500 let in at once, logged in in parallel over two seconds: 250 a second. Its
    # first twenty, done at 2 s, had the other 480 waiting alongside all along (counted
    # as logins finished per second of the clock: twenty in no time, a rate unknown).
    clock = Clock()
    gate = protocol.LoginGate(500, clock=clock)
    tickets = [gate.arrive() for _ in range(500)]
    clock.now += 2.0
    for ticket in tickets[:20]:
        gate.leave(ticket, logged_in=True)
    for _ in range(20):  # the limit again
        gate.arrive()
    waits = [refused(gate) for _ in range(300)]
    # Booked at 375 a second, after the 500 waiting (1.3 s): the last at 2.1 s.
    assert 2.0 <= max(waits) <= 2.2


def test_fewer_than_ten_logins_are_not_yet_taken_for_a_rate():
    # Nine logins, a tenth of a second each: not yet ten a second, 1,000 assumed.
    clock = Clock()
    gate = protocol.LoginGate(1, clock=clock)
    logins_finishing(gate, clock, 9, every_s=0.1)
    gate.arrive()
    waits = [refused(gate) for _ in range(1000)]  # booked at 1,500 a second
    assert max(waits) <= 1.0 + 0.8


def test_a_few_logins_now_and_then_are_not_taken_for_a_slow_console():
    # One login three seconds ago: a quiet console, not one that logs in a third of an
    # agent a second. Two may wait at once, as the limit says.
    clock = Clock()
    gate = protocol.LoginGate(2, patience_s=5.0, clock=clock)
    logins_finishing(gate, clock, 1, every_s=0.01)
    clock.now += 3.0
    gate.arrive()
    gate.arrive()
    assert gate.waiting == 2


def test_fewer_may_wait_when_logins_finish_slowly():
    """Ten logins of 0.4 s each, one at a time: 2.5 a second, so with 4.2 s of patience
    ten may wait, not the hundred of the limit."""
    clock = Clock()
    gate = protocol.LoginGate(100, patience_s=4.2, clock=clock)
    logins_finishing(gate, clock, 10, every_s=0.4)
    for _ in range(10):
        gate.arrive()
    refused(gate)
    assert gate.waiting == 10


def test_a_lull_with_nobody_waiting_is_not_taken_for_a_slow_console():
    # A hundred logins a second; then four seconds with nobody waiting (the refused not
    # back yet); then a few more. Counted as logins finished per second of the clock
    # that is 21 a second, and the next 300 refused would be booked over ten seconds.
    clock = Clock()
    gate = protocol.LoginGate(1, clock=clock)
    logins_finishing(gate, clock, 100, every_s=0.01)
    clock.now += 4.0
    logins_finishing(gate, clock, 5, every_s=0.01)
    gate.arrive()
    waits = [refused(gate) for _ in range(300)]
    assert max(waits) <= 1.0 + 2.1  # booked at 150 a second
