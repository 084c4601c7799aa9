"""Waking a leaf for its clients' changes: one task for a burst, at once for a quiet
leaf, after the gathering interval for one that looked lately (so that a steady stream
of changes costs a pass an interval, not a pass a change). Real Redis; the task sent
is caught."""

from __future__ import annotations

import time

import pytest
from django.conf import settings

from broker.dispatch import wakeups

LEAF = 987_654  # no such dispatcher: only its keys in Redis are used


@pytest.fixture
def sent(monkeypatch) -> list[tuple]:
    calls: list[tuple] = []
    monkeypatch.setattr(wakeups, "queue_of", lambda dispatcher_id: f"dispatcher.{dispatcher_id}")
    monkeypatch.setattr(
        wakeups.current_app, "send_task",
        lambda name, args, queue, countdown: calls.append((name, args, countdown)),
    )  # fmt: skip
    redis = wakeups._redis()
    for key in (wakeups.FLAG, wakeups.LOOKED):
        redis.delete(key.format(kind=wakeups.CHANGES, dispatcher=LEAF))
    return calls


def test_a_quiet_leaf_is_woken_at_once_and_a_burst_costs_one_task(sent):
    for _ in range(5):
        wakeups.wake(wakeups.CHANGES, LEAF)
    assert sent == [(wakeups.APPLY_CLIENT_CHANGES, [LEAF], None)]


def test_a_leaf_that_looked_lately_gathers_its_next_changes_for_an_interval(sent):
    wakeups.wake(wakeups.CHANGES, LEAF)
    wakeups.woken(wakeups.CHANGES, LEAF)  # the task looks: later changes wake it again
    wakeups.wake(wakeups.CHANGES, LEAF)
    wakeups.wake(wakeups.CHANGES, LEAF)
    gather_s = settings.TREE_CHANGES_GATHER_MS / 1000
    assert [countdown for _, _, countdown in sent] == [None, gather_s]


def test_once_the_interval_is_over_the_leaf_is_quiet_again(sent):
    wakeups.wake(wakeups.CHANGES, LEAF)
    wakeups.woken(wakeups.CHANGES, LEAF)
    time.sleep(settings.TREE_CHANGES_GATHER_MS / 1000 + 0.05)
    wakeups.wake(wakeups.CHANGES, LEAF)
    assert [countdown for _, _, countdown in sent] == [None, None]
