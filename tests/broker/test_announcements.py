"""Announcements to the consoles are best effort and never hold up the change
(broker.push.to_consoles)."""

from __future__ import annotations

import asyncio
import logging
import threading

from broker.push import to_consoles
from tests.broker.agent_helpers import wait_for


def test_an_announcement_does_not_wait_for_its_sending(monkeypatch):
    started, release = threading.Event(), threading.Event()

    async def slow_sends(topics):
        started.set()
        while not release.is_set():  # held until the test has its answer
            await asyncio.sleep(0.01)

    monkeypatch.setattr(to_consoles, "_group_sends", slow_sends)
    to_consoles.clients_changed([999_001])  # returns with the sends still held
    assert started.wait(10) and not release.is_set()
    release.set()


def test_an_announcement_that_fails_is_logged_not_raised(monkeypatch, caplog):
    async def failing_sends(topics):
        raise ConnectionError("Redis is down")

    monkeypatch.setattr(to_consoles, "_group_sends", failing_sends)
    with caplog.at_level(logging.WARNING, logger="broker.push.to_consoles"):
        to_consoles.clients_changed([999_002])
        # Waited for by its topic: the test before may leave a topic of its own queued,
        # whose failure is logged first.
        logged = lambda: "client.999002" in caplog.text  # noqa: E731
        wait_for(logged, "the failure is logged", 10)
    assert "could not announce" in caplog.text and "Redis is down" in caplog.text


def test_announcements_go_on_after_a_failure(monkeypatch):
    sent = []

    async def fail_once(topics):
        if not sent:
            sent.append(None)
            raise ConnectionError("Redis is down")
        sent.extend(topics)

    monkeypatch.setattr(to_consoles, "_group_sends", fail_once)
    to_consoles.clients_changed([999_003])
    wait_for(lambda: len(sent) == 1, "the first send failed", 10)
    to_consoles.clients_changed([999_004])
    wait_for(lambda: "client.999004" in sent, "the next one is sent", 10)
