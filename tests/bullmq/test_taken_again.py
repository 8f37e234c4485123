"""A run whose processor starts after this worker took its job again, with a new token.

A fetched job waits for its processor while other processors block the loop;
if its lock is lost meanwhile (the process was paused past the TTL) a stalled
check hands the job back and this same worker takes it again, with a new
token, before the first run's processor has started. When the loop runs
again both processors start, the stale one first: it must read its lock lost
at once, and must not take the job's renewal from the run that holds the lock.

The worker is driven as its run loop drives it (``getNextJob(token)``, then
``processJob(job, job.token)``), in that order.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from bullmq import Worker

from actors.bullmq import LOCK_LOST, use_actor_lock_manager
from tests.bullmq.harness import PREFIX, Bench, LoopThread

#: BullMQ's ``lockDuration``, in milliseconds.
LOCK_MS = 1000
#: How long the run holding the lock works, in lock durations.
HOLD = 2
#: Longest wait for one step of the worker, in seconds.
SETTLE_S = 10.0


def test_a_stale_run_starting_late_is_aborted_and_leaves_the_lock_to_the_new_one(
    one_bench: Bench,
) -> None:
    bench = one_bench
    bench.control()
    loop = LoopThread("bullmq-taken-again")
    looks: dict[str, tuple[bool, str | None]] = {}
    held: list[tuple[object, int]] = []

    async def process(job: Any, token: str, signal: Any) -> str:
        looks[token] = (signal.aborted, signal.reason)  # the first look, before any await
        if signal.aborted:
            return "stale"
        lock = bench.key(str(job.id), "lock")
        until = time.monotonic() + HOLD * LOCK_MS / 1000
        while time.monotonic() < until:
            held.append((bench.client.get(lock), bench.client.pttl(lock)))
            await asyncio.sleep(LOCK_MS / 1000 / 20)
        looks[token + " at the end"] = (signal.aborted, signal.reason)
        return "done"

    async def start() -> Any:
        options = {"connection": bench.url, "prefix": PREFIX, "autorun": False}
        worker = Worker(bench.queue, process, {**options, "lockDuration": LOCK_MS})
        use_actor_lock_manager(worker)
        worker.lockManager.start()  # as worker.run() does first
        return worker

    worker = loop.call(start)
    try:
        job_id = bench.add_job()

        async def fetch(token: str) -> Any:
            job = await worker.getNextJob(token)
            assert str(job.id) == job_id
            return job

        # Given a job fetched (its processor not started),
        first = loop.call(lambda: fetch("run-1"))
        # handed back by a stalled check (as after a pause past its lock's TTL),
        pipe = bench.client.pipeline(transaction=True)
        pipe.lrem(bench.key("active"), 1, job_id)
        pipe.rpush(bench.key("wait"), job_id)
        pipe.zadd(bench.key("marker"), {"0": 0})
        pipe.execute()
        # and taken again by this worker with a new token,
        second = loop.call(lambda: fetch("run-2"))
        assert bench.client.get(bench.key(job_id, "lock")) == "run-2"

        # when the first run's processor starts first, then the second's,
        async def both() -> None:
            stale = asyncio.ensure_future(worker.processJob(first, first.token))
            await asyncio.sleep(0)  # the stale run's processor looks first
            await worker.processJob(second, second.token)
            await stale

        loop.call(both, timeout=HOLD * LOCK_MS / 1000 + SETTLE_S)

        # then the stale run reads its lock lost at its first look,
        aborted, reason = looks["run-1"]
        assert aborted and str(reason).startswith(f"{LOCK_LOST} (taken again)")
        # and the new run keeps its lock renewed throughout and completes the job.
        assert looks["run-2"] == (False, None)
        assert looks["run-2 at the end"] == (False, None)
        assert held and all(token == "run-2" and ttl > 0 for token, ttl in held)
        assert bench.job(job_id).get("returnvalue") == '"done"'
    finally:

        async def close() -> None:
            await asyncio.wait_for(worker.close(), SETTLE_S)

        try:
            loop.call(close)
        finally:
            loop.close()
