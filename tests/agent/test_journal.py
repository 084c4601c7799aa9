"""The agent's journal: one agent per state folder, and what it keeps."""

from __future__ import annotations

import os
import time

import pytest
from sn_agent.client import Notification
from sn_agent.journal import KEEP_ANSWERED, Journal, StateInUse


def notification(position: int) -> Notification:
    return Notification(position * 10, f"event-{position}", 1, "commands", position, {}, position)


def test_a_second_agent_on_the_same_state_folder_is_refused_naming_the_first(tmp_path):
    first = Journal(tmp_path)
    try:
        with pytest.raises(StateInUse, match=f"pid {os.getpid()}"):
            Journal(tmp_path)
    finally:
        first.close()
    Journal(tmp_path).close()  # free again once the first is closed


def test_the_position_and_outcomes_survive_reopening(tmp_path):
    journal = Journal(tmp_path)
    journal.note(notification(1), action="disable-cgi", state="started", boot="b")
    journal.finish(1, "ok", {"exit_code": 0, "output": "done"})
    journal.note(notification(2), action="shutdown", state="started", boot="b")
    journal.close()

    again = Journal(tmp_path)
    assert again.position() == 2
    assert [e.position for e in again.unfinished()] == [2]
    [unanswered] = again.unanswered()
    assert (unanswered.position, unanswered.result) == (1, {"exit_code": 0, "output": "done"})
    again.close()


def handed(journal: Journal, position: int, *, event: str, until: float | None) -> None:
    """A delivery handled to the end: taken, answered and acknowledged."""
    taken = Notification(position * 10, event, 1, "commands", position, {}, position)
    journal.note(taken, action="status", state="started", boot="b", remember_until=until)
    journal.finish(position, "ok", {"exit_code": 0})
    journal.answered(position)


def test_an_event_is_remembered_until_its_lifetime_is_over_whatever_comes_after(tmp_path):
    journal = Journal(tmp_path)
    now = time.time()
    handed(journal, 1, event="genuine", until=now + 600)
    for position in range(2, KEEP_ANSWERED + 12):  # junk written into the database
        handed(journal, position, event=f"junk-{position}", until=None)
    journal.prune(now=now)

    assert journal.latest(KEEP_ANSWERED + 20)[-1].position > 1  # the delivery is forgotten
    assert journal.earlier_position_of("genuine", 5000) == 1  # the event is not
    journal.prune(now=now + 601)
    assert journal.earlier_position_of("genuine", 5000) is None  # it could not run anyway
    journal.close()


def test_a_journal_says_when_its_memory_began_and_keeps_it_across_reopening(tmp_path):
    before = time.time()
    journal = Journal(tmp_path)
    since = journal.memory_since()
    journal.set_attributes_since({"load": 0.2})
    journal.set_attributes_since({"load": 0.9})  # only the first is kept
    journal.close()

    again = Journal(tmp_path)
    assert before <= since <= time.time() and again.memory_since() == since
    assert again.attributes_since() == {"load": 0.2}
    again.close()
