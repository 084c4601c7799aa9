"""A web process closes the agent sessions it hears nothing from (broker.protocol)."""

import asyncio
import time
from dataclasses import dataclass, field

from broker.protocol import SILENT_AFTER_HEARTBEATS, SilenceWatch


@dataclass(eq=False)
class Session:
    heard_at: float = field(default_factory=time.monotonic)


def test_only_sessions_unheard_for_three_heartbeats_are_silent():
    watch = SilenceWatch(heartbeat_s=30, close=None)
    now = time.monotonic()
    talkative, late, gone = Session(now - 10), Session(now - 89), Session(now - 91)
    watch.sessions.update([talkative, late, gone])
    assert SILENT_AFTER_HEARTBEATS == 3
    assert watch.silent(now) == [gone]


def test_the_sweep_closes_the_silent_once_and_keeps_those_still_heard():
    async def scenario():
        closed = []

        async def close(session):
            closed.append(session)

        watch = SilenceWatch(heartbeat_s=0.05, close=close)
        quiet, talking, ended = Session(), Session(), Session()
        for session in (quiet, talking, ended):
            watch.watch(session)
        watch.forget(ended)
        for _ in range(8):  # 0.4 s: quiet is silent after 0.15 s
            talking.heard_at = time.monotonic()
            await asyncio.sleep(0.05)
        watch.sweeper.cancel()
        return closed, watch.sessions, talking

    closed, still_watched, talking = asyncio.run(scenario())
    assert len(closed) == 1 and closed[0] is not talking
    assert still_watched == {talking}
