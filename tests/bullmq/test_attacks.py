"""Attacks on ``use_actor_lock_manager``: bullmq's rate limiter, and a close behind a blocked loop.

Each worker runs on a loop thread of its own (see ``harness.py``) against the
run's default server; every wait derives from ``LOCK_MS`` or is a polling deadline.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import Counter
from typing import Any

import pytest

from actors import get_stats
from tests.bullmq.harness import CLOSE_S, Bench, wait_until

#: bullmq's ``lockDuration`` in ms: a job that runs 1.5 of it needs its lock renewed.
LOCK_MS = 1000
#: Two stalled checks per lock duration: a lock not renewed in time is found at once.
OPTIONS: dict[str, Any] = {
    "lockDuration": LOCK_MS,
    "stalledInterval": LOCK_MS // 2,
    "maxStalledCount": 1,
    "concurrency": 4,
}
JOBS = 8


def _live_threads() -> set[threading.Thread]:
    return {thread for thread in threading.enumerate() if thread.is_alive()}


def _losses(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith("actors")
        and r.levelno >= logging.WARNING
        and ("lost" in r.getMessage().lower() or "stolen" in r.getMessage().lower())
    ]


def test_jobs_held_back_by_the_rate_limiter_are_neither_reported_lost_nor_run_twice(
    one_bench: Bench, caplog: pytest.LogCaptureFixture
) -> None:
    # Catches: a rate-limited fetch (moveToActive answering "limited", no job) taken for a
    # job and tracked (then reported lost), or a held-back job whose lock is not renewed.
    caplog.set_level(logging.INFO, logger="actors")
    limit = {"max": 2, "duration": LOCK_MS}
    runs: list[tuple[str, str, float]] = []

    async def process(job: Any, token: str) -> str:
        runs.append((str(job.id), token, time.monotonic()))
        await asyncio.sleep(1.5 * LOCK_MS / 1000)
        return "done"

    # Given 8 jobs and a worker of concurrency 4 limited to 2 jobs a lock duration,
    # whose own stalled check runs twice per lock duration
    worker = one_bench.start_worker("limited", process, {**OPTIONS, "limiter": limit}, actor=True)
    ids = [one_bench.add_job({"n": n}) for n in range(JOBS)]

    # When the limiter holds jobs back while others run past their first lock duration
    expected_s = (JOBS / limit["max"]) * limit["duration"] / 1000 + 1.5 * LOCK_MS / 1000
    # bullmq-py 3.4.4 does not wait out the limiter by itself: a fetch that the limiter
    # refuses leaves the worker in BZPOPMIN until a new marker. A queue that keeps
    # getting jobs wakes it; here the test adds the markers, as Queue.add would.
    deadline = time.monotonic() + 3 * expected_s + 10
    while len(worker.events.of("completed")) + len(worker.events.of("failed")) < JOBS:
        assert time.monotonic() < deadline, f"jobs did not end: {len(runs)} runs"
        one_bench.client.zadd(one_bench.key("marker"), {"0": 0})
        time.sleep(limit["duration"] / 4 / 1000)

    # Then the limiter did hold jobs back (at most 2 starts per window)
    starts = sorted(at for _, _, at in runs)
    assert starts[-1] - starts[0] >= (JOBS / limit["max"] - 1) * limit["duration"] / 1000 * 0.9
    for first, third in zip(starts, starts[2:], strict=False):
        assert third - first >= limit["duration"] / 1000 * 0.9, starts
    # and every job ran once and completed, nothing stalled, nothing was reported lost
    assert Counter(job_id for job_id, _, _ in runs) == dict.fromkeys(ids, 1)
    assert sorted(str(e.args[0].id) for e in worker.events.of("completed")) == sorted(ids)
    assert worker.events.of("failed") == []
    assert worker.events.of("stalled") == []
    assert worker.events.of("lockRenewalFailed") == []
    assert worker.events.of("error") == []
    for job_id in ids:
        assert one_bench.job(job_id).get("ats") == "1", one_bench.job(job_id)
        assert one_bench.job(job_id).get("stc", "0") == "0"
    assert worker.lock_manager is not None and worker.lock_manager.manager is not None
    stats = get_stats(worker.lock_manager.manager, timeout=10)
    assert stats.lost == 0
    assert stats.tracked == 0
    assert _losses(caplog) == []


def test_close_while_processors_block_the_loop_returns_and_leaves_nothing_behind(
    one_bench: Bench, caplog: pytest.LogCaptureFixture
) -> None:
    # Catches: a close that hangs behind blocking processors, a job run twice or
    # half-moved, a lock still renewed after close, a leaked manager thread, a false loss.
    caplog.set_level(logging.INFO, logger="actors")
    block_s = 1.2 * LOCK_MS / 1000
    runs: list[tuple[str, str, float]] = []
    started = threading.Event()

    async def process(job: Any, token: str) -> str:
        runs.append((str(job.id), token, time.monotonic()))
        started.set()
        time.sleep(block_s)  # blocks the worker's event loop
        return "done"

    one_bench.control()  # the bench's own loop thread (adds jobs): not the worker's
    before = _live_threads()
    worker = one_bench.start_worker("blocking", process, OPTIONS, actor=True)
    assert worker.lock_manager is not None
    ids = [one_bench.add_job({"n": n}) for n in range(JOBS)]
    assert started.wait(10 + 2 * LOCK_MS / 1000), "no job started"
    manager = worker.lock_manager.manager
    assert manager is not None

    # When the worker is closed while a processor blocks its loop
    asked = time.monotonic()
    worker.close()  # fails with every task's stack if close does not return
    closed_s = time.monotonic() - asked

    # Then close returned once the jobs in hand were done (at most concurrency of them)
    assert closed_s < OPTIONS["concurrency"] * block_s + CLOSE_S
    counts = Counter(job_id for job_id, _, _ in runs)
    assert all(count == 1 for count in counts.values()), counts
    for job_id in ids:
        job = one_bench.job(job_id)
        if "finishedOn" in job:
            # finished: run once, by this worker, completed
            assert counts[job_id] == 1 and job.get("ats") == "1", job
            assert "returnvalue" in job, job
        else:
            # left to the stalled check (or never taken): never run, and in wait or active
            assert counts[job_id] == 0, (job_id, job)
            in_wait = job_id in one_bench.client.lrange(one_bench.key("wait"), 0, -1)
            in_active = job_id in one_bench.client.lrange(one_bench.key("active"), 0, -1)
            assert in_wait or in_active, (job_id, job)
    assert worker.events.of("lockRenewalFailed") == []
    assert _losses(caplog) == []
    # and nobody renews any lock any more: whatever lock is left expires within its TTL
    assert not manager.is_alive()
    wait_until(
        lambda: not one_bench.client.keys(one_bench.key("*", "lock")),
        LOCK_MS / 1000 + 5,
        "every lock left to expire",
    )
    # and no thread of the worker or its manager is left
    wait_until(
        lambda: _live_threads() <= before, 10, f"every thread to end: {_live_threads() - before}"
    )
