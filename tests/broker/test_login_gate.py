"""The login gate (broker.protocol.LoginGate): at most so many logins at once in a web
process; beyond, a refusal that says when to come back, spread over the backlog."""

from __future__ import annotations

import random

import pytest

from broker import protocol


def test_logins_beyond_the_limit_are_refused_as_busy_and_admitted_once_one_finishes():
    gate = protocol.LoginGate(2)
    with gate.admitted(), gate.admitted():
        with pytest.raises(protocol.Busy) as refused, gate.admitted():
            pass
        assert refused.value.code == "busy"
    with gate.admitted():
        assert gate.running == 1
    assert gate.running == 0


def test_a_login_that_fails_still_frees_its_place():
    gate = protocol.LoginGate(1)
    with pytest.raises(RuntimeError), gate.admitted():
        raise RuntimeError("the database is down")
    with gate.admitted():
        assert gate.running == 1


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


def test_a_crowd_of_refused_logins_is_told_to_come_back_over_the_time_the_backlog_takes():
    gate = protocol.LoginGate(1, rng=random.Random(7))
    waits = []
    with gate.admitted():
        for _ in range(1000):
            with pytest.raises(protocol.Busy) as refused, gate.admitted():
                pass
            waits.append(refused.value.retry_after_s)
    # 1,000 refused at the assumed 200 logins a second: five seconds of backlog, and
    # no wait beyond it or below a second; the later refused, the wider the spread.
    assert min(waits) >= 1.0 and max(waits) <= 5.1
    assert max(waits[-100:]) > 4.0
    assert len(set(waits)) > 30


def test_no_refusal_asks_for_more_than_a_minute():
    gate = protocol.LoginGate(0)
    for _ in range(20_000):
        with pytest.raises(protocol.Busy) as refused, gate.admitted():
            pass
    assert refused.value.retry_after_s <= protocol.LoginGate.LONGEST_WAIT_S
