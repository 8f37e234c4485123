"""Where a thread cannot help: a processor that holds the GIL inside C code.

A catastrophic regular expression runs inside the ``re`` engine without
letting go of the GIL, so no other thread of the process runs until it ends:
not the worker's loop, not the manager's timer, not its renewal. The manager's
own statistics show it: the tick due during the match runs that much late, and
by then the lock has expired. The same match in a process pool leaves the
GIL free, and the lock is renewed throughout.

These run on the default engine only: the engine plays no part.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
from concurrent.futures import ProcessPoolExecutor
from typing import TYPE_CHECKING, Any

import pytest

from actors import get_stats
from actors.bullmq import LOCK_LOST
from tests.bullmq.burn import backtrack, backtrack_for, size_for
from tests.bullmq.harness import OUTCOMES, Bench, sample_lock, wait_until

if TYPE_CHECKING:
    from collections.abc import Iterator

    from bullmq.abort_controller import AbortSignal

    from actors import Stats

#: BullMQ's ``lockDuration``, in milliseconds.
LOCK_MS = 1000
#: The manager's tick interval with bullmq's default ``lockRenewTime``.
INTERVAL_MS = LOCK_MS // 4
#: How long the match should hold the GIL: two lock durations (it is checked
#: to outlast one: the load of the machine changes how long it really takes).
HOLD_S = 2 * LOCK_MS / 1000
#: Longest wait for a worker to take the job or finish with it, in seconds.
SETTLE_S = 15.0


@pytest.fixture
def size() -> int:
    # Calibrated right before each test: the machine's load changes the speed.
    return size_for(HOLD_S)


@pytest.fixture(scope="module")
def pool() -> Iterator[ProcessPoolExecutor]:
    # spawn: a fork of this many-threaded process could inherit a held lock.
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        pool.submit(backtrack, 1).result(SETTLE_S)  # start the child before any timing
        yield pool


def stats_of(bench: Bench, running: Any) -> Stats:
    manager = running.lock_manager.manager
    assert manager is not None
    return get_stats(manager, timeout=5)


def test_c_code_holding_the_gil_starves_the_renewal_thread(one_bench: Bench, size: int) -> None:
    started = threading.Event()
    seen: dict[str, Any] = {}

    async def process(job: Any, token: str, signal: AbortSignal) -> str:
        started.set()
        seen["match_ms"] = backtrack(size) * 1000
        # The lock is gone by now: wait for the manager to say so.
        await asyncio.wait_for(signal.wait(), SETTLE_S)
        seen["reason"] = signal.reason
        return "too late"

    # Given a worker whose locks our manager renews from its thread,
    a = one_bench.start_worker("A", process, {"lockDuration": LOCK_MS}, actor=True)
    # when its processor holds the GIL in C code for longer than a lock duration,
    job_id = one_bench.add_job()
    assert started.wait(SETTLE_S)
    wait_until(lambda: "reason" in seen, SETTLE_S, "the processor to hear of its lock")
    stats = stats_of(one_bench, a)

    # then the tick due during the match ran only after it (as late as the
    # match was long, less at most one interval),
    match_ms = seen["match_ms"]
    assert match_ms > LOCK_MS
    assert stats.max_tick_lateness_ms >= match_ms - INTERVAL_MS - 50
    # and its deadline passed with no renewal confirmed: the thread could not
    # help, and the run is told its lock may be gone.
    assert seen["reason"] == f"{LOCK_LOST} (unconfirmed): job {job_id}"
    assert stats.lost == 1

    OUTCOMES.add(
        "GIL held in C code",
        where="re.match in the processor",
        match_ms=round(match_ms),
        max_tick_lateness_ms=round(stats.max_tick_lateness_ms),
        lost=stats.lost,
        min_lock_margin_ms=stats.min_lock_margin_ms,
    )


def test_the_same_match_in_a_process_pool_keeps_the_lock(
    one_bench: Bench, size: int, pool: ProcessPoolExecutor
) -> None:
    started = threading.Event()
    finished = threading.Event()
    seen: dict[str, Any] = {}

    async def process(job: Any, token: str, signal: AbortSignal) -> str:
        seen["token"] = token
        started.set()
        try:
            loop = asyncio.get_running_loop()
            # Matches of a quarter of the hold each, until the hold is over:
            # the pool's process runs them at its own speed, not the calibrated one.
            burn = loop.run_in_executor(pool, backtrack_for, max(1, size - 2), HOLD_S)
            seen["match_ms"] = await burn * 1000
        finally:
            finished.set()
        return "done"

    a = one_bench.start_worker("A", process, {"lockDuration": LOCK_MS}, actor=True)
    job_id = one_bench.add_job()
    assert started.wait(SETTLE_S)
    samples = sample_lock(
        one_bench.client,
        one_bench.key(job_id, "lock"),
        one_bench.key("stalled-check"),
        finished,
        HOLD_S + SETTLE_S,
    )
    wait_until(lambda: a.events.of("completed"), SETTLE_S, "the job to complete")
    stats = stats_of(one_bench, a)

    # The matches took as long, but in another process: every tick ran on time
    # and the lock held the worker's token throughout.
    assert seen["match_ms"] > LOCK_MS
    assert all(s.value == seen["token"] and s.pttl > 0 for s in samples)
    assert stats.lost == 0
    assert stats.max_tick_lateness_ms < INTERVAL_MS

    OUTCOMES.add(
        "GIL held in C code",
        where="re.match in a process pool",
        match_ms=round(seen["match_ms"]),
        max_tick_lateness_ms=round(stats.max_tick_lateness_ms),
        lost=stats.lost,
        min_lock_margin_ms=stats.min_lock_margin_ms,
    )


def test_in_process_mode_the_hold_keeps_the_lock_and_no_stalled_check_takes_it(
    one_bench: Bench,
) -> None:
    # About four lock durations (twice as long as HOLD_S; at least two, checked):
    # a stalled check every quarter lock would take the job long before the hold
    # ends, were the lock let go.
    size = size_for(HOLD_S) + 1
    checker = one_bench.start_peer(
        "B", {"lockDuration": LOCK_MS, "stalledInterval": LOCK_MS // 4, "paused": True}
    )
    seen: dict[str, Any] = {}

    async def process(job: Any, token: str, signal: AbortSignal) -> str:
        seen["match_ms"] = backtrack(size) * 1000
        seen["aborted"] = signal.aborted
        return "done"

    # Given a worker whose locks a child process renews,
    a = one_bench.start_worker(
        "A", process, {"lockDuration": LOCK_MS}, actor=True, isolation="process"
    )
    # when its processor holds the GIL in C code for several lock durations,
    one_bench.add_job()
    wait_until(lambda: a.events.of("completed"), 8 * HOLD_S + SETTLE_S, "the job to complete")
    stats = stats_of(one_bench, a)

    # then the child renewed throughout: no loss, the run never aborted, and the
    # stalled checker found the lock at every look.
    assert seen["match_ms"] > 2 * LOCK_MS
    assert seen["aborted"] is False
    assert stats.lost == 0
    assert checker.stalled_ids() == []
    assert not a.events.of("failed")

    OUTCOMES.add(
        "GIL held in C code",
        where="re.match in the processor, process mode",
        match_ms=round(seen["match_ms"]),
        max_tick_lateness_ms=round(stats.max_tick_lateness_ms),
        lost=stats.lost,
        min_lock_margin_ms=stats.min_lock_margin_ms,
    )
