"""A job this worker takes again with the token of the run that just gave it back.

bullmq-py 3.4 gives every fetch of one pass of its run loop the same token
(its fetches read the loop's ``token`` variable when they run). A fetch of
that pass still waiting for a job (BZPOPMIN) when another run of the pass
fails on purpose takes the retried job again, with the very token of the run
that gave it back. The two runs are two holders of the lock, one after the
other; the end of the first (its move's answer, bullmq's ``untrack_job``)
must not end the renewal of the second, whose processor may start long after
its fetch when other processors block the loop.

The worker is driven here as its run loop drives it (``getNextJob(token)``,
then ``processJob(job, job.token)``), so that the fetch of the same pass
comes at the moment it does in a run: once the retry has put the job back,
before or after the retry's answer is handled.
"""

from __future__ import annotations

import asyncio
import functools
import time
from typing import TYPE_CHECKING, Any

import pytest
from bullmq import Worker

from actors.bullmq import use_actor_lock_manager
from tests.bullmq.harness import PREFIX, Bench, LoopThread

if TYPE_CHECKING:
    from collections.abc import Callable

#: BullMQ's ``lockDuration``, in milliseconds.
LOCK_MS = 1000
#: How long the second run's processor waits to start, in lock durations.
LATE = 2
#: Longest wait for one step of the worker, in seconds.
SETTLE_S = 10.0


class Designed(Exception):
    """The first attempt fails on purpose: bullmq retries the job (``retryJob``)."""


@pytest.mark.parametrize("fetched", ["before", "after"])
def test_a_job_taken_again_with_the_same_token_keeps_its_lock(
    one_bench: Bench, fetched: str
) -> None:
    bench = one_bench
    bench.control()
    loop = LoopThread("bullmq-same-token")
    attempts: list[tuple[int, str]] = []
    errors: list[str] = []
    again: list[Any] = []

    async def process(job: Any, token: str) -> str:
        attempts.append((int(job.attemptsMade), token))
        if int(job.attemptsMade) == 0:
            raise Designed("the first attempt fails on purpose")
        return "done"

    def fetching_again(retry: Callable[..., Any], worker: Any, token: str) -> Callable[..., Any]:
        @functools.wraps(retry)
        async def retried(*args: Any, **kwargs: Any) -> Any:
            answer = await retry(*args, **kwargs)
            # The job is back in wait: the pass's waiting fetch takes it, same token.
            again.append(await worker.getNextJob(token))
            return answer

        return retried

    async def start() -> tuple[Any, str]:
        options = {"connection": bench.url, "prefix": PREFIX, "autorun": False}
        worker = Worker(bench.queue, process, {**options, "lockDuration": LOCK_MS})
        worker.on("error", lambda error, *_: errors.append(str(error)))
        # The token bullmq's run loop gives the fetches of its first pass.
        token = f"{worker.id}:1"
        if fetched == "before":
            # The second fetch answered before the retry's answer is handled.
            backend = worker.backend
            backend.retryJob = fetching_again(backend.retryJob, worker, token)
        use_actor_lock_manager(worker)
        if fetched == "after":
            backend = worker.backend
            backend.retryJob = fetching_again(backend.retryJob, worker, token)
        worker.lockManager.start()  # as worker.run() does first
        return worker, token

    worker, token = loop.call(start)
    try:
        job_id = bench.add_job({}, {"attempts": 2})
        lock = bench.key(job_id, "lock")

        async def first_run() -> None:
            job = await worker.getNextJob(token)
            assert str(job.id) == job_id
            await worker.processJob(job, job.token)

        # Given the job's first run, failed on purpose and retried, and taken
        # again by a fetch with the first run's token,
        loop.call(first_run)
        [job] = again
        assert str(job.id) == job_id
        assert attempts == [(0, token)]
        held = bench.client.get(lock)
        assert held == job.token

        # when the second run's processor starts only LATE lock durations later
        # (other processors block the loop), its lock is renewed all that time,
        until = time.monotonic() + LATE * LOCK_MS / 1000
        while time.monotonic() < until:
            assert bench.client.get(lock) == held, "the second run's lock was let go"
            assert bench.client.pttl(lock) > 0
            time.sleep(LOCK_MS / 1000 / 20)

        async def second_run() -> None:
            await worker.processJob(job, job.token)

        # and the second run completes the job.
        loop.call(second_run, timeout=SETTLE_S)
        assert attempts == [(0, token), (1, job.token)]
        assert errors == []
        assert bench.job(job_id).get("returnvalue") == '"done"'
    finally:

        async def close() -> None:
            await asyncio.wait_for(worker.close(), SETTLE_S)

        try:
            loop.call(close)
        finally:
            loop.close()


def test_the_fetches_of_one_pass_take_their_jobs_with_tokens_of_their_own(
    one_bench: Bench,
) -> None:
    bench = one_bench
    seen: dict[str, tuple[str, str | None]] = {}
    started = asyncio.Event()

    async def process(job: Any, token: str) -> str:
        # The lock as the server holds it while the run is under way.
        held = bench.client.get(bench.key(str(job.id), "lock"))
        seen[str(job.id)] = (token, None if held is None else str(held))
        if len(seen) == 3:
            started.set()
        await asyncio.wait_for(started.wait(), SETTLE_S)
        return "done"

    # Given three jobs waiting when a worker at concurrency 3 starts (its first
    # pass sends three fetches, to which bullmq 3.4 gives one token),
    ids = [bench.add_job() for _ in range(3)]
    a = bench.start_worker("A", process, {"lockDuration": LOCK_MS, "concurrency": 3}, actor=True)
    deadline = time.monotonic() + SETTLE_S
    while len(a.events.of("completed")) < 3:
        assert time.monotonic() < deadline, "the three jobs did not complete"
        time.sleep(0.01)

    # then each run holds its job with a token of its own, the lock's value.
    assert sorted(seen) == sorted(ids)
    tokens = [token for token, _ in seen.values()]
    assert len(set(tokens)) == 3
    assert all(token == held for token, held in seen.values())
    assert a.events.of("error") == []
