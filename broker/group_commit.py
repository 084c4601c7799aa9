"""Group commit: requests of one kind from many sessions of a process, run together.

A thousand agents confirming one push are a thousand short statements, each with its
thread hop, round trip and commit. A `GroupCommit` runs the first request at once,
alone; those that arrive while it runs wait for it and then run together, in one
call, and so on. Under light load nothing waits longer than before; under heavy load
each call carries many requests. One made with `gather_s` waits that long before each
call, for requests that nobody waits on and that come steadily but sparsely.

A call that fails as a whole (a deadlock, a dropped connection) is not allowed to fail
every request in it: each is then run again on its own, and only a request that fails
alone gets its own error.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

Item = TypeVar("Item")
Outcome = TypeVar("Outcome")

logger = logging.getLogger(__name__)
# What a batch call answers for one request: its outcome, or the error it gets.
RunBatch = Callable[[list[Item]], Awaitable[list[Any]]]


@dataclass
class _Queue:
    waiting: list[tuple[Any, asyncio.Future]] = field(default_factory=list)
    flushing: asyncio.Task | None = None


class GroupCommit(Generic[Item, Outcome]):
    """Runs `run` on batches of submitted items: at most `limit` at a time, at most one
    item per `key` (two requests of one client never share a call), one call at a time
    per event loop. `run` returns, in order, each item's outcome or the exception that
    item gets (a refusal, say)."""

    def __init__(
        self,
        run: RunBatch,
        *,
        key: Callable[[Item], Hashable],
        limit: int = 200,
        gather_s: float = 0.0,
    ):
        self._run = run
        self._key = key
        self._limit = limit
        # How long a call waits for more requests before it runs: for requests nobody
        # waits on (an agent's load report, its presence), which otherwise arrive a few
        # a second per process and run alone, each a transaction of its own.
        self._gather_s = gather_s
        # Per event loop: futures belong to the loop that made them (tests run several).
        self._queues: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    async def submit(self, item: Item) -> Outcome:
        """The item's outcome once its batch ran; raises the error it got."""
        loop = asyncio.get_running_loop()
        queue = self._queues.get(loop)
        if queue is None:  # setdefault would make a queue and a weak reference each time
            queue = self._queues[loop] = _Queue()
        future = loop.create_future()
        queue.waiting.append((item, future))
        if queue.flushing is None or queue.flushing.done():
            queue.flushing = loop.create_task(self._flush(queue))
        return await future

    async def _flush(self, queue: _Queue) -> None:
        while queue.waiting:
            if self._gather_s:
                await asyncio.sleep(self._gather_s)
            batch = self._take(queue)
            await self._run_batch(batch)

    def _take(self, queue: _Queue) -> list[tuple[Any, asyncio.Future]]:
        """The oldest waiting items, one per key, up to the limit; the others stay in
        their order."""
        batch, keys, rest = [], set(), []
        for entry in queue.waiting:
            key = self._key(entry[0])
            if len(batch) < self._limit and key not in keys:
                keys.add(key)
                batch.append(entry)
            else:
                rest.append(entry)
        queue.waiting[:] = rest
        return batch

    async def _run_batch(self, batch: list[tuple[Any, asyncio.Future]]) -> None:
        try:
            outcomes = await self._run([item for item, _ in batch])
        except Exception as error:
            if len(batch) == 1:
                _settle(batch[0][1], error)
                return
            logger.warning("a batch of %d failed; running each alone", len(batch), exc_info=True)
            for entry in batch:
                await self._run_batch([entry])
            return
        for (_, future), outcome in zip(batch, outcomes, strict=True):
            _settle(future, outcome)


def _settle(future: asyncio.Future, outcome: Any) -> None:
    if future.done():  # its session ended meanwhile: nobody waits for it
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)
