"""At any concurrency, each job is renewed from the fetch that takes its lock to its move.

Worker A (bullmq-py with ``use_actor_lock_manager``, concurrency 2) runs a
processor that blocks its loop for three lock durations at one chosen moment;
worker B, a paused stock worker in a process of its own, runs bullmq's stalled
check twice per lock duration. A lock left unrenewed for one lock duration is
found by B's check, and its job runs twice or fails "Missing lock".
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

import pytest

from tests.bullmq.harness import Bench, RunningWorker, wait_until

if TYPE_CHECKING:
    from collections.abc import Callable

    from tests.faults.conftest import FaultRecord

#: BullMQ's ``lockDuration``, in milliseconds; renewal every half of it.
LOCK_MS = 1000
#: How long a processor blocks its loop, in seconds.
BLOCK_S = 3 * LOCK_MS / 1000
#: Longest wait for the jobs to finish, in seconds: the blocks, and margin.
SETTLE_S = 15.0

#: Worker A: two jobs at a time, short locks.
OPTIONS = {"lockDuration": LOCK_MS, "concurrency": 2}
#: Worker B: checks for stalled jobs twice per lock duration, takes none itself.
CHECKER = {"lockDuration": LOCK_MS, "stalledInterval": LOCK_MS // 2, "paused": True}


def run_pair(bench: Bench, block: Callable[[Any], None], prepare: Any = None) -> RunningWorker:
    """Run a blocking job and a quick one on A, beside B's checks; return A when both are done."""
    runs: list[str] = []

    async def process(job: Any, token: str) -> str:
        runs.append(str(job.id))
        if job.data.get("block"):
            block(job)
        else:
            await asyncio.sleep(0.05)
        return "done"

    b = bench.start_peer("B", CHECKER)
    blocker = bench.add_job({"block": True})
    quick = bench.add_job({})
    a = bench.start_worker("A", process, OPTIONS, actor=True)
    if prepare is not None:
        a.loop.call(lambda: prepare(a))
    wait_until(
        lambda: all("finishedOn" in bench.job(job) for job in (blocker, quick)),
        SETTLE_S,
        "both jobs to finish",
    )
    wait_until(lambda: not a.busy(), SETTLE_S, "worker A to finish")

    # Then each job ran once on A and completed; no check stalled either,
    assert sorted(runs) == sorted([blocker, quick])
    assert b.stalled_ids() == [] and b.runs() == []
    for job in (blocker, quick):
        assert bench.job(job).get("stc", "0") == "0"
        assert bench.job(job)["ats"] == "1"
    completed = {str(event.args[0].id) for event in a.events.of("completed")}
    assert completed == {blocker, quick}
    # and no lock was reported lost, nor any move refused for a missing lock.
    assert a.events.of("failed") == []
    assert a.events.of("lockRenewalFailed") == []
    assert a.events.of("error") == []
    assert bench.client.llen(bench.key("active")) == 0
    return a


def sleep(job: Any) -> None:
    time.sleep(BLOCK_S)


def test_a_job_fetched_beside_a_blocked_loop_keeps_its_lock(
    one_bench: Bench, record: FaultRecord
) -> None:
    record.fault = "event loop blocked 3x lockDuration under the bullmq integration"
    record.asserted = "no loss: each job ran once, no stall, no lockRenewalFailed, no Missing lock"
    # Given both jobs fetched at once, when one processor blocks the loop
    # before the other's processor has started (or after it returned),
    a = run_pair(one_bench, sleep)
    record.notes = {"lost": len(a.events.of("lockRenewalFailed")), "concurrency": 2}


def test_a_finished_job_keeps_its_lock_until_its_move_is_sent(one_bench: Bench) -> None:
    # Given a job whose processor returned, when the loop blocks before
    # bullmq sends its move to completed,
    async def prepare(a: RunningWorker) -> None:
        backend = a.worker.backend
        move = backend.moveToCompleted

        async def late(job: Any, *args: Any, **kwargs: Any) -> Any:
            if not job.data.get("block"):
                time.sleep(BLOCK_S)
            return await move(job, *args, **kwargs)

        backend.moveToCompleted = late

    run_pair(one_bench, lambda job: None, prepare)


def test_a_loss_seen_while_the_move_is_under_way_is_not_reported(one_bench: Bench) -> None:
    # Given a move the server has run (deleting the lock), when the loop
    # blocks before its answer is read, ticks find the lock gone meanwhile.
    async def prepare(a: RunningWorker) -> None:
        scripts = a.worker.backend.scripts
        finish = scripts.moveToFinished

        async def answered_late(job_id: str, *args: Any, **kwargs: Any) -> Any:
            answer = await finish(job_id, *args, **kwargs)
            time.sleep(BLOCK_S)
            # What the manager reported meanwhile reaches the loop first.
            await asyncio.sleep(LOCK_MS / 1000 / 10)
            return answer

        scripts.moveToFinished = answered_late

    run_pair(one_bench, lambda job: None, prepare)


def test_a_fetch_answered_while_the_loop_is_blocked_is_renewed(one_bench: Bench) -> None:
    # Given a fetch sent just before the loop blocks: the server takes the
    # job's lock, and its answer waits for the loop.
    async def prepare(a: RunningWorker) -> None:
        scripts = a.worker.backend.scripts
        fetch = scripts.commands["moveToActive"]
        blocked: list[bool] = []

        async def fetch_then_block(*args: Any, **kwargs: Any) -> Any:
            sent = asyncio.ensure_future(fetch(*args, **kwargs))
            if not blocked:
                blocked.append(True)
                # The loop runs until the server has taken the job, then blocks.
                deadline = time.monotonic() + SETTLE_S
                while not one_bench.client.llen(one_bench.key("active")):
                    assert time.monotonic() < deadline, "the fetch did not take the job"
                    await asyncio.sleep(0)
                time.sleep(BLOCK_S)
            return await sent

        scripts.commands = {**scripts.commands, "moveToActive": fetch_then_block}

    run_pair(one_bench, lambda job: None, prepare)


@pytest.mark.parametrize("concurrency", [1, 3])
def test_the_fetch_runs_the_worker_s_own_script(one_bench: Bench, concurrency: int) -> None:
    # The fetch goes through a client of its own: the job it hands bullmq is
    # the one bullmq's own client would have read, and is processed once.
    seen: list[tuple[str, dict[str, Any], str]] = []

    async def process(job: Any, token: str) -> str:
        seen.append((str(job.id), job.data, job.name))
        return "ok"

    ids = [one_bench.add_job({"n": n, "text": "žluťoučký 🐎"}) for n in range(4)]
    a = one_bench.start_worker(
        "A", process, {"lockDuration": LOCK_MS, "concurrency": concurrency}, actor=True
    )
    wait_until(lambda: len(a.events.of("completed")) == len(ids), SETTLE_S, "the jobs")
    assert sorted(seen) == sorted(
        (job_id, {"n": n, "text": "žluťoučký 🐎"}, "work") for n, job_id in enumerate(ids)
    )
