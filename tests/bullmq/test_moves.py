"""A processor that moves its own job away from active is never told its lock was lost.

``job.moveToDelayed`` and ``job.moveToWaitingChildren`` delete the job's lock,
then the processor raises bullmq's ``DelayedError`` or ``WaitingChildrenError``.
Until it does, the job is still the worker's; a tick in that window must not
find the lock gone and report it. When the job does not move (no pending
children, or the move is refused), its lock must go on being renewed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from typing import TYPE_CHECKING, Any

import pytest
import redis
from bullmq import Queue
from bullmq.custom_errors import DelayedError, WaitingChildrenError

from actors import aio, get_stats
from tests.bullmq.harness import PREFIX, Bench, wait_until

if TYPE_CHECKING:
    from bullmq.abort_controller import AbortSignal

    from actors import ManagerRef

#: BullMQ's ``lockDuration``, in milliseconds.
LOCK_MS = 1000
#: The manager's tick interval (bullmq's default ``lockRenewTime`` is half the lock).
INTERVAL_MS = LOCK_MS // 4
#: Ticks after which a job tracked all along has been due at least once.
ONE_RENEWAL = 3
#: Ticks that outlast the lock: had nothing renewed it, it would be gone.
PAST_THE_LOCK = LOCK_MS // INTERVAL_MS + 2
#: Longest wait for a worker to take the job or finish it, in seconds.
SETTLE_S = 10.0


async def first_tick(done: threading.Event) -> None:
    """Return once ``done`` is set by the manager's next tick (the loop stays free)."""
    deadline = time.monotonic() + INTERVAL_MS / 1000 + SETTLE_S
    while not done.is_set():
        assert time.monotonic() < deadline, "the manager did not tick"
        await asyncio.sleep(INTERVAL_MS / 1000 / 5)


async def ticks_pass(manager: ManagerRef, count: int) -> None:
    """Return once the manager has ticked ``count`` more times (the loop stays free)."""
    start = (await aio.get_stats(manager)).ticks
    deadline = time.monotonic() + count * INTERVAL_MS / 1000 + SETTLE_S
    while (await aio.get_stats(manager)).ticks < start + count:
        assert time.monotonic() < deadline, f"the manager did not tick {count} times"
        await asyncio.sleep(INTERVAL_MS / 1000 / 5)


def run_one(bench: Bench, process: Any) -> tuple[Any, str, dict[str, Any]]:
    """Run ``process`` on one job with our manager; return the worker, the job id, its notes."""
    notes: dict[str, Any] = {}

    async def processor(job: Any, token: str, signal: AbortSignal) -> Any:
        notes["signal"] = signal
        notes["token"] = token
        assert worker.lock_manager is not None
        return await process(job, token, worker.lock_manager.manager)

    worker = bench.start_worker("A", processor, {"lockDuration": LOCK_MS}, actor=True)
    job_id = bench.add_job()
    wait_until(lambda: "token" in notes, SETTLE_S, "the worker to take the job")
    wait_until(lambda: not worker.busy(), SETTLE_S + LOCK_MS / 1000 * 3, "the job to end")
    return worker, job_id, notes


def assert_no_loss_reported(worker: Any, notes: dict[str, Any]) -> None:
    assert worker.events.of("lockRenewalFailed") == []
    assert worker.events.of("error") == []
    assert not notes["signal"].aborted


def assert_completed_without_loss(worker: Any, job_id: str, notes: dict[str, Any]) -> None:
    # bullmq completes a job only while its lock holds the run's token.
    completed = worker.events.wait("completed", lambda e: str(e.args[0].id) == job_id, SETTLE_S)
    assert completed.args[1] == "done"
    assert_no_loss_reported(worker, notes)


def test_a_job_moved_to_delayed_is_not_reported_lost(one_bench: Bench) -> None:
    async def process(job: Any, token: str, manager: ManagerRef) -> None:
        await job.moveToDelayed(int(time.time() * 1000) + 60_000, token)
        # Still in the processor: ticks come and go before bullmq hears of it.
        await ticks_pass(manager, ONE_RENEWAL)
        raise DelayedError()

    worker, job_id, notes = run_one(one_bench, process)

    assert_no_loss_reported(worker, notes)
    assert one_bench.client.zscore(one_bench.key("delayed"), job_id) is not None
    assert worker.lock_manager.get_tracked_job_ids() == []


def test_a_job_that_waits_for_its_children_is_not_reported_lost(one_bench: Bench) -> None:
    children = f"{one_bench.queue}-children"

    async def process(job: Any, token: str, manager: ManagerRef) -> None:
        queue = Queue(children, {"connection": one_bench.url, "prefix": PREFIX})
        try:
            parent = {"id": job.id, "queue": f"{PREFIX}:{one_bench.queue}"}
            await queue.add("child", {}, {"parent": parent})
        finally:
            await queue.close()
        assert await job.moveToWaitingChildren(token, {})
        await ticks_pass(manager, ONE_RENEWAL)
        raise WaitingChildrenError()

    worker, job_id, notes = run_one(one_bench, process)

    assert_no_loss_reported(worker, notes)
    assert one_bench.client.zscore(one_bench.key("waiting-children"), job_id) is not None


def test_a_job_with_no_pending_children_stays_and_keeps_its_lock(one_bench: Bench) -> None:
    async def process(job: Any, token: str, manager: ManagerRef) -> str:
        # No children: the job stays active, and its lock must stay renewed
        # for as long as the processor goes on.
        assert not await job.moveToWaitingChildren(token, {})
        await ticks_pass(manager, PAST_THE_LOCK)
        return "done"

    worker, job_id, notes = run_one(one_bench, process)

    assert_completed_without_loss(worker, job_id, notes)


def test_a_refused_move_leaves_the_lock_renewed(one_bench: Bench) -> None:
    async def process(job: Any, token: str, manager: ManagerRef) -> str:
        # A child that failed refuses the move before the lock is touched.
        failed_child = one_bench.key(str(job.id), "unsuccessful")
        one_bench.client.zadd(failed_child, {"child": 1})
        try:
            await job.moveToWaitingChildren(token, {})
        except Exception as error:
            notes["refused"] = str(error)
        await ticks_pass(manager, PAST_THE_LOCK)
        # (The child is retried; now the job may complete.)
        one_bench.client.delete(failed_child)
        return "done"

    notes: dict[str, Any] = {}
    worker, job_id, seen = run_one(one_bench, process)

    assert "refused" in notes
    assert_completed_without_loss(worker, job_id, seen)


def test_a_move_with_another_runs_token_changes_nothing_here(one_bench: Bench) -> None:
    async def process(job: Any, token: str, manager: ManagerRef) -> str:
        # Refused by the script (the lock holds another token): nothing was
        # untracked, nothing is tracked again, the lock goes on.
        try:
            await job.moveToDelayed(int(time.time() * 1000) + 60_000, "not-this-run")
        except Exception as error:
            notes["refused"] = str(error)
        await ticks_pass(manager, PAST_THE_LOCK)
        return "done"

    notes: dict[str, Any] = {}
    worker, job_id, seen = run_one(one_bench, process)

    assert "refused" in notes
    assert_completed_without_loss(worker, job_id, seen)


def test_a_move_cancelled_before_it_is_sent_leaves_the_lock_renewed(one_bench: Bench) -> None:
    async def process(job: Any, token: str, manager: ManagerRef) -> str:
        # When a move is cancelled before the loop ever sends it,
        mover = asyncio.ensure_future(job.moveToDelayed(int(time.time() * 1000) + 60_000, token))
        mover.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await mover
        notes["cancelled"] = mover.cancelled()
        notes["active"] = one_bench.client.lpos(one_bench.key("active"), str(job.id)) is not None
        # then the job, still active, keeps its lock as long as the run goes on.
        await ticks_pass(manager, PAST_THE_LOCK)
        notes["held"] = one_bench.client.get(one_bench.key(str(job.id), "lock")) == token
        return "done"

    notes: dict[str, Any] = {}
    worker, job_id, seen = run_one(one_bench, process)

    assert notes == {"cancelled": True, "active": True, "held": True}
    assert_completed_without_loss(worker, job_id, seen)


@pytest.mark.parametrize("reply", ["cancelled", "timed out"])
def test_a_move_that_ran_but_never_answered_is_not_reported_lost(
    one_bench: Bench, reply: str
) -> None:
    async def process(job: Any, token: str, manager: ManagerRef) -> None:
        # Given a move the server runs, but whose reply the processor never gets.
        ran = asyncio.Event()
        scripts = job.backend.scripts
        move = scripts.moveToDelayed

        async def reply_lost(*args: Any, **kwargs: Any) -> Any:
            await move(*args, **kwargs)
            ran.set()
            if reply == "timed out":
                raise redis.exceptions.TimeoutError("Timeout reading from socket")
            return await asyncio.get_running_loop().create_future()

        scripts.moveToDelayed = reply_lost
        mover = asyncio.ensure_future(job.moveToDelayed(int(time.time() * 1000) + 60_000, token))
        await asyncio.wait_for(ran.wait(), SETTLE_S)
        if reply == "cancelled":
            # When the processor gives up on it (as asyncio.wait_for does).
            mover.cancel()
        with contextlib.suppress(asyncio.CancelledError, redis.exceptions.TimeoutError):
            await mover
        # Then no tick reports the lock the move deleted.
        await ticks_pass(manager, ONE_RENEWAL)
        raise DelayedError()

    worker, job_id, notes = run_one(one_bench, process)

    assert_no_loss_reported(worker, notes)
    assert one_bench.client.zscore(one_bench.key("delayed"), job_id) is not None
    assert worker.lock_manager.get_tracked_job_ids() == []


def test_a_move_whose_reply_waits_behind_a_blocked_loop_is_neither_logged_nor_counted_lost(
    one_bench: Bench, caplog: pytest.LogCaptureFixture
) -> None:
    async def process(job: Any, token: str, manager: ManagerRef) -> None:
        # Given a move the server runs while the loop is blocked before its reply is read
        scripts = job.backend.scripts
        move = scripts.moveToDelayed

        async def reply_behind_a_blocked_loop(*args: Any, **kwargs: Any) -> Any:
            answer = await move(*args, **kwargs)
            time.sleep(2 * LOCK_MS / 1000)  # another processor blocks the loop meanwhile
            return answer

        scripts.moveToDelayed = reply_behind_a_blocked_loop
        await job.moveToDelayed(int(time.time() * 1000) + 60_000, token)
        raise DelayedError()

    with caplog.at_level(logging.INFO, logger="actors"):
        worker, job_id, notes = run_one(one_bench, process)
    # Then the lock the move deleted is no loss: nothing says so, nothing counts it
    assert_no_loss_reported(worker, notes)
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert not [line for line in said if "lost the lock" in line], said
    manager = worker.lock_manager.manager
    assert manager is not None
    assert get_stats(manager, timeout=5).lost == 0
    assert one_bench.client.zscore(one_bench.key("delayed"), job_id) is not None
