"""The agent's journal: one agent per state folder, and what it keeps."""

from __future__ import annotations

import os

import pytest
from sn_agent.client import Notification
from sn_agent.journal import Journal, StateInUse


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
