"""The login gate (broker.protocol.LoginGate): at most so many connections of a web
process waiting to log in; beyond, a refusal that says when to come back: a slot of its
own, at the rate logins finish."""

from __future__ import annotations

import random
import time

import pytest

from broker import protocol


def refused(gate: protocol.LoginGate) -> float:
    """Arrive at a full gate: the wait it asks for."""
    with pytest.raises(protocol.Busy) as busy:
        gate.arrive()
    assert busy.value.code == "busy"
    return busy.value.retry_after_s


def test_connections_beyond_the_limit_are_refused_as_busy_until_one_leaves():
    gate = protocol.LoginGate(2)
    gate.arrive()
    gate.arrive()
    refused(gate)
    gate.leave(logged_in=True)
    gate.arrive()
    assert gate.waiting == 2


def test_a_connection_that_goes_away_without_logging_in_frees_its_place():
    gate = protocol.LoginGate(1)
    gate.arrive()
    gate.leave(logged_in=False)
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
    gate = protocol.LoginGate(1)
    gate.arrive()
    waits = [refused(gate) for _ in range(1500)]
    # 1,500 refused at the assumed 200 logins a second, booked half again as fast: one
    # every 3.3 ms from a second on, in the order they were refused, the last five
    # seconds later.
    assert protocol.LoginGate.ASSUMED_RATE * protocol.LoginGate.PACE == 300
    assert waits == sorted(waits)
    assert waits[0] == 1.1 and waits[-1] in (6.0, 6.1)
    assert abs(waits[749] - 3.5) <= 0.1
    assert max(waits.count(w) for w in set(waits)) <= 31  # about 30 a tenth of a second


def test_slots_already_past_are_not_booked_again():
    gate = protocol.LoginGate(1)
    gate.arrive()
    gate.booked_until = time.monotonic() - 30.0  # an earlier crowd's, long logged in
    assert refused(gate) == 1.1


def test_a_crowd_beyond_a_minute_of_slots_is_spread_over_that_minute():
    gate = protocol.LoginGate(0, rng=random.Random(7))
    waits = [refused(gate) for _ in range(30_000)]  # a minute at 300 a second: 18,000
    booked, beyond = waits[:17_500], waits[18_500:]
    assert booked == sorted(booked) and max(booked) <= protocol.LoginGate.LONGEST_WAIT_S
    assert min(beyond) < 10.0 and max(beyond) > 50.0


def test_no_refusal_asks_for_more_than_a_minute():
    gate = protocol.LoginGate(0)
    waits = [refused(gate) for _ in range(20_000)]
    assert max(waits) <= protocol.LoginGate.LONGEST_WAIT_S


def test_the_wait_follows_the_rate_logins_finish_at_since_they_began_finishing():
    gate = protocol.LoginGate(1)
    for _ in range(50):  # fifty logins finished within the last moment: a fast console
        gate.arrive()
        gate.leave(logged_in=True)
    gate.arrive()
    waits = [refused(gate) for _ in range(200)]
    # 50 a second at least (measured over a second, not the five-second window): the
    # 200 refused are booked over four seconds at most, not twenty.
    assert max(waits) <= 1.0 + 4.1


def test_logins_finishing_for_less_than_a_second_are_not_yet_taken_for_a_rate():
    # A crowd's first ten logins, a tenth of a second ago: measured over that second,
    # ten a second, and the crowd sent away for up to a minute; assumed, 200.
    gate = protocol.LoginGate(1)
    now = time.monotonic()
    gate.finished.extend(now - 0.1 + i * 0.01 for i in range(10))
    gate.arrive()
    waits = [refused(gate) for _ in range(1000)]
    assert max(waits) <= 1.0 + 5.1


def test_a_few_logins_now_and_then_are_not_taken_for_a_slow_console():
    # One login three seconds ago: a quiet console, not one that logs in a third of an
    # agent a second. Two may wait at once, as the limit says.
    gate = protocol.LoginGate(2, patience_s=5.0)
    gate.finished.append(time.monotonic() - 3.0)
    gate.arrive()
    gate.arrive()
    assert gate.waiting == 2


def test_fewer_may_wait_when_logins_finish_slowly():
    """Ten logins over the last four seconds: 2.5 a second, so with 4.2 s of patience
    ten may wait, not the hundred of the limit."""
    gate = protocol.LoginGate(100, patience_s=4.2)
    now = time.monotonic()
    gate.finished.extend(now - 4.0 + i * 0.4 for i in range(10))
    for _ in range(10):
        gate.arrive()
    refused(gate)
    assert gate.waiting == 10
