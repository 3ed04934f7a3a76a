"""`memorm.concurrency.Merger`: calls run a few at a time per loop, the rest merged, whatever is cancelled."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reliability.test_cancellation import loop_errors, settle

from memorm.concurrency import BLOCKED, BlockedCaller, Merger

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # Merger keeps a line per asyncio loop (LangGraph's store runs on asyncio)


class Recorder:
    """`work` for a Merger: each call's result is its number times ten; every run recorded."""

    def __init__(self, pause: float = 0.01, fail_with: int | None = None) -> None:
        self.runs: list[list[int]] = []
        self.pause = pause
        self.fail_with = fail_with  # a call whose run fails
        self.started = asyncio.Event()
        self.on_end: Callable[[], object] | None = None  # called as a run ends, once

    async def __call__(self, calls: list[int]) -> Sequence[int]:
        self.runs.append(list(calls))
        self.started.set()
        await asyncio.sleep(self.pause)
        if self.on_end is not None:
            self.on_end()
            self.on_end = None
        if self.fail_with in calls:
            raise ValueError(f"run of {calls} failed")
        return [call * 10 for call in calls]


async def test_a_lone_call_runs_at_once_alone() -> None:
    work = Recorder(pause=0)
    merger = Merger(work, width=2, most=10)
    assert await merger(7) == 70
    assert await merger(8) == 80
    assert work.runs == [[7], [8]]


async def test_calls_past_the_width_wait_and_run_next_merged_each_getting_its_own_result() -> None:
    work = Recorder()
    merger = Merger(work, width=2, most=4)
    results = await asyncio.gather(*(merger(n) for n in range(10)))
    assert results == [n * 10 for n in range(10)]
    assert work.runs[:2] == [[0], [1]]  # two at once, alone
    assert sorted(n for run in work.runs for n in run) == list(range(10))  # each call run once
    assert [len(run) for run in work.runs[2:]] == [4, 4]  # then the eight waiting, in two merged runs


async def test_a_cancelled_waiting_call_is_skipped() -> None:
    work = Recorder()
    merger = Merger(work, width=1, most=10)
    first = asyncio.ensure_future(merger(1))
    await work.started.wait()
    waiting = [asyncio.ensure_future(merger(n)) for n in (2, 3, 4)]
    await asyncio.sleep(0)
    waiting[1].cancel()
    assert await first == 10
    assert [await waiting[0], await waiting[2]] == [20, 40]
    assert waiting[1].cancelled()
    assert work.runs == [[1], [2, 4]]


@pytest.mark.parametrize(
    ("cancelled", "runs"),
    [
        (2, [[1], [2, 3, 4]]),  # 4, carried by 2's run: it returns at once, the run goes on for the others
        (0, [[1], [2, 3, 4], [3, 4]]),  # 2, running it: the run is abandoned, 3 and 4 run again
    ],
    ids=["a-call-carried", "the-call-running-it"],
)
async def test_cancelling_a_call_of_a_merged_run(cancelled: int, runs: list[list[int]]) -> None:
    work = Recorder(pause=0.05)
    merger = Merger(work, width=1, most=10)
    first = asyncio.ensure_future(merger(1))
    await work.started.wait()
    followers = [asyncio.ensure_future(merger(n)) for n in (2, 3, 4)]
    assert await first == 10
    while len(work.runs) < 2:  # noqa: ASYNC110 (the merged run of 2, 3 and 4 has started, in 2's task)
        await asyncio.sleep(0.001)
    followers[cancelled].cancel()
    with pytest.raises(asyncio.CancelledError):
        await followers[cancelled]
    others = [task for index, task in enumerate(followers) if index != cancelled]
    assert [await task for task in others] == [
        n * 10 for index, n in enumerate((2, 3, 4)) if index != cancelled
    ]
    assert work.runs == runs


async def test_a_waiting_call_timed_out_by_wait_for_is_skipped_and_the_run_goes_on() -> None:
    work = Recorder(pause=0.05)
    merger = Merger(work, width=1, most=10)
    first = asyncio.ensure_future(merger(1))
    await work.started.wait()
    kept = asyncio.ensure_future(merger(2))
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(merger(3), 0.01)  # still waiting when its deadline passes
    assert [await first, await kept] == [10, 20]
    assert work.runs == [[1], [2]]


async def test_a_failed_run_fails_every_call_it_carried_and_the_line_goes_on() -> None:
    work = Recorder(fail_with=3)
    merger = Merger(work, width=1, most=10)
    with loop_errors() as seen:
        first = asyncio.ensure_future(merger(1))
        await work.started.wait()
        carried = [asyncio.ensure_future(merger(n)) for n in (2, 3)]
        assert await first == 10
        for task in carried:
            with pytest.raises(ValueError, match=r"run of \[2, 3\] failed"):
                await task
        assert await merger(5) == 50
        del first, carried
        await settle()
    assert seen == []


async def test_a_call_woken_to_run_as_it_is_cancelled_passes_the_run_on() -> None:
    work = Recorder(pause=0.02)
    merger = Merger(work, width=1, most=10)
    first = asyncio.ensure_future(merger(1))
    await work.started.wait()
    second = asyncio.ensure_future(merger(2))
    third = asyncio.ensure_future(merger(3))
    await asyncio.sleep(0)
    # As 1's run ends, 2 is woken to run next: cancel it before its task resumes.
    loop = asyncio.get_running_loop()
    work.on_end = lambda: loop.call_soon(second.cancel)
    assert await first == 10
    with pytest.raises(asyncio.CancelledError):
        await second
    assert await asyncio.wait_for(third, 5) == 30
    assert work.runs == [[1], [3]]


async def test_each_loop_has_its_own_line() -> None:
    work = Recorder(pause=0.02)
    merger = Merger(work, width=1, most=10)

    def other_loop() -> list[int]:
        async def calls() -> list[int]:
            return list(await asyncio.gather(merger(100), merger(101)))

        return asyncio.run(calls())

    here = asyncio.gather(merger(1), merger(2))
    there = await asyncio.to_thread(other_loop)
    assert await here == [10, 20]
    assert there == [1000, 1010]
    assert sorted(map(sorted, work.runs)) == [[1], [2], [100], [101]]  # one at a time on each loop


async def test_a_call_blocking_another_loops_thread_runs_at_once_past_the_width() -> None:
    """The runs ahead may wait for that loop (its SQLite write lock, its rows): it waits for this call."""
    held = asyncio.Event()

    async def work(calls: list[int]) -> Sequence[int]:
        if 0 in calls:
            await held.wait()  # a run waiting for the blocked loop
        return [call * 10 for call in calls]

    merger = Merger(work, width=1, most=10)
    ahead = asyncio.create_task(merger(0))
    await asyncio.sleep(0)
    caller = BlockedCaller(asyncio.get_running_loop(), "f()", "Await af()")

    async def bridged() -> int:  # what the sync bridge's task does (in a context of its own)
        BLOCKED.set((caller,))
        return await merger(1)

    try:
        assert await asyncio.wait_for(bridged(), 5) == 10
        assert not ahead.done()
    finally:
        held.set()
    assert await ahead == 0


@settings(max_examples=40, deadline=None)
@given(
    width=st.integers(1, 3),
    most=st.integers(1, 5),
    plan=st.lists(st.tuples(st.integers(0, 3), st.sampled_from(["wait", "cancel"])), min_size=1, max_size=12),
)
def test_every_call_not_cancelled_gets_its_own_result_and_the_line_empties(
    width: int, most: int, plan: list[tuple[int, str]]
) -> None:
    async def scenario() -> None:
        work = Recorder(pause=0.002)
        merger = Merger(work, width=width, most=most)
        tasks = []
        for number, (delay, fate) in enumerate(plan):
            tasks.append((asyncio.ensure_future(merger(number)), fate))
            await asyncio.sleep(delay / 1000)
        for index, (task, fate) in enumerate(tasks):
            if fate == "cancel" and index % 2:
                task.cancel()
        for number, (task, _) in enumerate(tasks):
            try:
                assert await asyncio.wait_for(task, 5) == number * 10
            except asyncio.CancelledError:
                assert task.cancelled()
        line = merger._lines[asyncio.get_running_loop()]
        assert line.running == 0
        assert all(waiting.future.done() for waiting in line.waiting)

    asyncio.run(scenario())
