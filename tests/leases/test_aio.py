"""asyncio code awaits the manager without stopping its event loop.

The manager is made busy for a fixed time: its own thread is held in a
reading of its clock (the ``clock=`` seam) as it begins a tick of 100,000 due
jobs (renewed by an in-memory lock table, through the ``renewer=`` seam), so
nothing it is asked meanwhile is answered. A ticker task measures how
regularly the loop turns. Awaiting the queries of :mod:`actors.aio` leaves it
turning; awaiting pykka's own future (whose ``__await__`` calls the blocking
``get``) stops it for the whole hold: that second case shows the measure can fail.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any

import pykka
import pytest
import redis

import actors
from actors import ExtendLocks, GetStats, ManagerRef, ManagerStopped, QueueKeys, TrackJob, aio
from tests.conftest import Server
from tests.leases.tools import LOCK_MS
from tests.support import HoldingClock, LockTable, ManualTimers, settle, take_locks

if TYPE_CHECKING:
    from tests.conftest import StartManager

KEYS = QueueKeys("aio")
JOBS = 100_000
#: How long the manager's thread is held, in seconds.
HOLD_S = 0.5
#: The ticker's period, in seconds.
PERIOD_S = 0.01
#: The longest gap between two turns of a loop that is never blocked: ten
#: periods, room for the GIL being busy with the 100k-job bookkeeping.
TURN_BOUND_S = 10 * PERIOD_S
#: Most seconds an idle manager takes to answer, with room for a loaded machine.
ANSWER_S = 5.0


@pytest.fixture
def clock() -> Iterator[HoldingClock]:
    clock = HoldingClock()
    yield clock
    clock.release()


def _busy(clock: HoldingClock, jobs: int) -> ManagerRef:
    """A manager beginning a tick of ``jobs`` due jobs, held until ``clock.release()``."""
    table = LockTable()
    manager = actors.start_link(renewer=table, keys=KEYS, clock=clock, timer=ManualTimers())
    for n in range(jobs):
        job_id = f"job-{n}"
        table.held[job_id] = "token"
        # Taken long ago: every job is due at the first tick.
        manager.tell(TrackJob(job_id, "token", ts=0))
    settle(manager, timeout=60)
    clock.hold(manager._manager.thread)
    manager.tell(ExtendLocks())
    clock.wait_held(ANSWER_S)
    return manager


@pytest.fixture
def busy(clock: HoldingClock) -> Iterator[ManagerRef]:
    """A manager busy with a tick of 100,000 jobs."""
    manager = _busy(clock, JOBS)
    yield manager
    clock.release()
    actors.stop(manager)


@pytest.fixture
def busy_small(clock: HoldingClock) -> Iterator[ManagerRef]:
    """A manager busy with a tick of a few jobs: as busy, for as long."""
    manager = _busy(clock, 3)
    yield manager
    clock.release()
    actors.stop(manager)


def _ticking(
    release: Callable[[], None], wait: Callable[[], Awaitable[Any]]
) -> tuple[Any, list[float], float, float]:
    """Run ``wait`` beside a ticker while ``release`` is called ``HOLD_S`` from now.

    Returns what ``wait`` returned, the ticker's gaps (seconds), when the
    manager was released and when ``wait`` returned (monotonic seconds).
    """
    opened: list[float] = []

    def open_gate() -> None:
        opened.append(time.monotonic())
        release()

    async def main() -> tuple[Any, list[float], float]:
        gaps: list[float] = []
        done = asyncio.Event()

        async def ticker() -> None:
            last = time.monotonic()
            while not done.is_set():
                await asyncio.sleep(PERIOD_S)
                now = time.monotonic()
                gaps.append(now - last)
                last = now

        task = asyncio.ensure_future(ticker())
        await asyncio.sleep(0)
        # A thread releases the manager: it must, even when the loop is stuck.
        threading.Timer(HOLD_S, open_gate).start()
        result = await wait()
        answered_at = time.monotonic()
        done.set()
        await task
        return result, gaps, answered_at

    result, gaps, answered_at = asyncio.run(main())
    return result, gaps, opened[0], answered_at


def test_the_loop_keeps_turning_while_the_queries_wait_for_a_busy_manager(
    busy: ManagerRef, clock: HoldingClock
) -> None:
    # Given a manager busy with a tick of 100,000 jobs,
    # when a task awaits every query and an untrack while the tick goes on
    async def queries() -> tuple[Any, ...]:
        return tuple(
            await asyncio.gather(
                aio.get_stats(busy),
                aio.get_active_job_count(busy),
                aio.get_tracked_job_ids(busy),
                aio.is_tracked(busy, "job-7"),
                aio.untrack_job(busy, "job-7"),
                aio.is_tracked(busy, "job-7"),
            )
        )

    result, gaps, opened_at, answered_at = _ticking(clock.release, queries)

    # then they were answered only once the manager was free, after the tick began,
    stats, count, ids, before, _, after = result
    assert answered_at >= opened_at
    assert stats.ticks == 1 and stats.tracked == JOBS
    assert count == JOBS and len(ids) == JOBS
    assert (before, after) == (True, False)
    # and the loop kept turning all along
    assert len(gaps) >= 0.5 * HOLD_S / PERIOD_S
    assert max(gaps) <= TURN_BOUND_S, f"the loop stood still for {max(gaps) * 1000:.0f} ms"


def test_awaiting_pykkas_own_future_stops_the_loop(
    busy_small: ManagerRef, clock: HoldingClock
) -> None:
    # Given a busy manager, when a task awaits pykka's future directly
    async def blocking() -> Any:
        return await busy_small.ask(GetStats(), block=False)

    stats, gaps, opened_at, answered_at = _ticking(clock.release, blocking)

    # then the loop stood still until the manager was free
    assert (stats.ticks, stats.tracked) == (1, 3)
    assert answered_at >= opened_at
    assert max(gaps) >= 0.8 * HOLD_S


def test_a_timeout_raises_pykka_timeout(busy_small: ManagerRef) -> None:
    async def main() -> float:
        started = time.monotonic()
        with pytest.raises(pykka.Timeout):
            await aio.get_stats(busy_small, timeout=0.05)
        with pytest.raises(pykka.Timeout):
            await aio.untrack_job(busy_small, "job-1", timeout=0.05)
        return time.monotonic() - started

    assert asyncio.run(main()) < HOLD_S


def test_many_waiting_questions_wait_on_no_thread(
    busy_small: ManagerRef, clock: HoldingClock
) -> None:
    before = set(threading.enumerate())

    async def main() -> tuple[list[int], int]:
        # Given two hundred tasks waiting on the busy manager at once
        asking = [asyncio.ensure_future(aio.get_active_job_count(busy_small)) for _ in range(200)]
        await asyncio.sleep(0)
        threads = len(set(threading.enumerate()) - before)
        clock.release()
        return list(await asyncio.gather(*asking)), threads

    counts, threads = asyncio.run(main())
    # then no thread was started to wait for their answers, and each got its own
    assert threads == 0
    assert counts == [3] * 200


def test_an_answer_that_never_comes_holds_up_no_other_question(manager: ManagerRef) -> None:
    # Given a task awaiting a future that is never answered
    never: pykka.ThreadingFuture[int] = pykka.ThreadingFuture()

    async def main() -> tuple[int, bool]:
        stuck = asyncio.ensure_future(aio.answer(manager, never))
        await asyncio.sleep(0)
        # when other tasks then ask the same manager
        count = await aio.get_active_job_count(manager, timeout=ANSWER_S)
        await aio.untrack_job(manager, "a", timeout=ANSWER_S)
        waiting = not stuck.done()
        stuck.cancel()
        return count, waiting

    # then each gets its answer, and only the first task still waits
    assert asyncio.run(main()) == (0, True)


def test_a_question_left_in_a_stopping_managers_mailbox_gets_manager_stopped(
    busy_small: ManagerRef, clock: HoldingClock
) -> None:
    # Given a busy manager, told to stop once it is free,
    busy_small.stop(block=False)

    async def main() -> None:
        # when a task asks it something that lands behind the stop
        asking = asyncio.ensure_future(aio.get_stats(busy_small))
        untracking = asyncio.ensure_future(aio.untrack_job(busy_small, "job-1"))
        await asyncio.sleep(0)
        clock.release()
        # then the question gets the stopped manager's error, not a bare
        # ActorDeadError, and the untrack is simply done
        with pytest.raises(ManagerStopped, match="queue 'aio' is stopped"):
            await asking
        await untracking

    asyncio.run(main())


@pytest.fixture
def manager(server: Server, redis_client: redis.Redis, start_manager: StartManager) -> ManagerRef:
    return start_manager(connection=server.url, keys=KEYS, lock_duration=LOCK_MS)


def test_the_queries_answer_as_the_helpers_do(
    manager: ManagerRef, redis_client: redis.Redis
) -> None:
    tokens = take_locks(redis_client, KEYS, ["a", "b", "c"], LOCK_MS)
    for job_id, token in tokens.items():
        actors.track_job(manager, job_id, token)

    async def main() -> tuple[Any, ...]:
        await aio.untrack_job(manager, "b")
        return (
            await aio.get_active_job_count(manager),
            sorted(await aio.get_tracked_job_ids(manager)),
            await aio.is_tracked(manager, "a"),
            await aio.is_tracked(manager, "b"),
            (await aio.get_stats(manager)).tracked,
            await aio.ask(manager, actors.GetActiveJobCount()),
        )

    assert asyncio.run(main()) == (2, ["a", "c"], True, False, 2, 2)
    assert actors.get_tracked_job_ids(manager) == ["a", "c"]


def test_a_stopped_manager(manager: ManagerRef, caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        await aio.stop(manager)
        await aio.stop(manager)  # idempotent
        for query in (aio.get_stats, aio.get_active_job_count, aio.get_tracked_job_ids):
            with pytest.raises(ManagerStopped):
                await query(manager)
        with pytest.raises(ManagerStopped):
            await aio.is_tracked(manager, "a")
        # A stopped manager tracks nothing: untracking is done, with one warning.
        await aio.untrack_job(manager, "a")
        await aio.untrack_job(manager, "b")

    with caplog.at_level(logging.WARNING, logger="actors"):
        asyncio.run(main())
    assert len([r for r in caplog.records if "is stopped" in r.getMessage()]) == 1


def test_bad_arguments_raise_in_the_callers_task(manager: ManagerRef) -> None:
    async def main() -> None:
        with pytest.raises(TypeError, match="manager must be"):
            await aio.get_stats("redis://localhost")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="job_id"):
            await aio.untrack_job(manager, "")
        with pytest.raises(TypeError, match="job_id"):
            await aio.is_tracked(manager, 42)  # type: ignore[arg-type]

    asyncio.run(main())
    assert actors.get_active_job_count(manager) == 0
