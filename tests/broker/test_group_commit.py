"""Group commit (broker/group_commit.py): requests that wait run together, each gets
its own outcome, and a batch that fails as a whole fails no request that succeeds alone."""

from __future__ import annotations

import asyncio

import pytest

from broker.group_commit import GroupCommit


class Recorder:
    """A batch call that records its batches, holding each until released."""

    def __init__(self, fail_batches_with: set[str] | None = None) -> None:
        self.batches: list[list[str]] = []
        self.release = asyncio.Event()
        self.fail_batches_with = fail_batches_with or set()

    async def __call__(self, items: list[str]) -> list:
        self.batches.append(list(items))
        await self.release.wait()
        if len(items) > 1 and self.fail_batches_with & set(items):
            raise RuntimeError("the whole batch failed")
        return [ValueError(item) if item.startswith("bad") else item.upper() for item in items]


def first_letter(item: str) -> str:
    return item[0]


async def started(group: GroupCommit, *items: str) -> list[asyncio.Task]:
    tasks = [asyncio.create_task(group.submit(item)) for item in items]
    await asyncio.sleep(0)  # they are queued, and the first batch began
    return tasks


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, timeout=10))


def test_the_first_request_runs_alone_and_those_arriving_meanwhile_run_together():
    async def flow():
        recorder = Recorder()
        group = GroupCommit(recorder, key=str)
        tasks = await started(group, "a1")
        tasks += await started(group, "b1", "c1", "d1")
        recorder.release.set()
        return recorder.batches, await asyncio.gather(*tasks)

    batches, outcomes = run(flow())
    assert batches == [["a1"], ["b1", "c1", "d1"]]
    assert outcomes == ["A1", "B1", "C1", "D1"]


def test_two_requests_with_one_key_never_share_a_batch_and_keep_their_order():
    async def flow():
        recorder = Recorder()
        group = GroupCommit(recorder, key=first_letter)
        tasks = await started(group, "x0")
        tasks += await started(group, "a1", "a2", "b1", "a3")
        recorder.release.set()
        await asyncio.gather(*tasks)
        return recorder.batches

    assert run(flow()) == [["x0"], ["a1", "b1"], ["a2"], ["a3"]]


def test_a_batch_takes_at_most_the_limit():
    async def flow():
        recorder = Recorder()
        group = GroupCommit(recorder, key=str, limit=2)
        tasks = await started(group, "a", "b", "c", "d", "e")
        recorder.release.set()
        await asyncio.gather(*tasks)
        return recorder.batches

    assert run(flow()) == [["a", "b"], ["c", "d"], ["e"]]


def test_a_request_refused_in_a_batch_raises_for_its_submitter_only():
    async def flow():
        recorder = Recorder()
        recorder.release.set()
        group = GroupCommit(recorder, key=str)
        return await asyncio.gather(
            *(group.submit(item) for item in ("a", "bad", "c")), return_exceptions=True
        )

    good, refused, other = run(flow())
    assert (good, other) == ("A", "C")
    assert isinstance(refused, ValueError) and str(refused) == "bad"


def test_a_batch_failing_as_a_whole_runs_each_request_again_alone():
    async def flow():
        recorder = Recorder(fail_batches_with={"poison"})
        group = GroupCommit(recorder, key=str)
        tasks = await started(group, "first")
        tasks += await started(group, "a", "poison", "c")
        recorder.release.set()
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        return recorder.batches, outcomes

    batches, outcomes = run(flow())
    assert batches == [["first"], ["a", "poison", "c"], ["a"], ["poison"], ["c"]]
    assert outcomes == ["FIRST", "A", "POISON", "C"]


def test_a_request_failing_alone_gets_the_error():
    async def broken(items):
        raise ConnectionError("the database went away")

    async def flow():
        return await GroupCommit(broken, key=str).submit("a")

    with pytest.raises(ConnectionError):
        run(flow())


def test_a_submitter_that_gives_up_does_not_stop_the_others():
    async def flow():
        recorder = Recorder()
        group = GroupCommit(recorder, key=str)
        tasks = await started(group, "first")
        leaving, staying = await started(group, "leaving", "staying")
        leaving.cancel()
        recorder.release.set()
        return await asyncio.gather(*tasks, staying), recorder.batches

    outcomes, batches = run(flow())
    assert outcomes == ["FIRST", "STAYING"]
    assert batches == [["first"], ["leaving", "staying"]]


def test_a_gathering_group_runs_the_requests_of_its_interval_together_even_the_first():
    async def flow():
        recorder = Recorder()
        recorder.release.set()
        group = GroupCommit(recorder, key=str, gather_s=0.05)
        tasks = await started(group, "a1")
        await asyncio.sleep(0.01)  # still within the interval
        tasks += await started(group, "b1", "c1")
        outcomes = await asyncio.gather(*tasks)
        tasks = await started(group, "d1")  # the next interval
        return recorder.batches, outcomes + await asyncio.gather(*tasks)

    batches, outcomes = run(flow())
    assert batches == [["a1", "b1", "c1"], ["d1"]]
    assert outcomes == ["A1", "B1", "C1", "D1"]
