"""One contender's run of the throughput benchmark, in a fresh Python process.

Run by :mod:`tests.bench.test_throughput` as
``python -m tests.bench.throughput URL QUEUE CONTENDER CONCURRENCY JOBS WAIT_JOBS``,
where ``CONTENDER`` is ``stock`` (a plain bullmq-py ``Worker``), ``thread`` or
``process`` (the same worker with ``use_actor_lock_manager(worker,
isolation=CONTENDER)``). The worker keeps bullmq's defaults (``lockDuration``
30,000 ms, ``stalledInterval`` 30,000 ms, ``drainDelay`` 5 s, completed jobs
kept: no ``removeOnComplete``) but for ``concurrency``. Its processor returns
at once.

1. Throughput: ``JOBS`` jobs are added with ``Queue.addBulk`` (in chunks of
   :data:`ADD_CHUNK`) before the worker starts. The worker is created with
   ``autorun`` off and the lock manager installed and started (a process-mode
   manager spawns its child here); then the clock starts as ``worker.run()``
   is called and stops at the worker's ``JOBS``-th ``completed`` event.
2. Waits: the process sets ``bull:{QUEUE}:bench-ready``; the test then adds
   ``WAIT_JOBS`` jobs one by one at a steady rate (:func:`add_steadily`), each
   with the ``time.time()`` of its add in ``data["added"]``. Each run of such a
   job records ``time.time() - data["added"]`` as its processor starts.

Once the worker has completed ``JOBS + WAIT_JOBS`` jobs, the process writes
its :class:`RunResult` as one JSON line on stdout, closes the worker (giving
up after :data:`CLOSE_S`: bullmq-py's idle close may hang in its blocking
fetch, taskforcesh/bullmq#4597) and writes a :class:`CloseResult` line.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

import redis.asyncio
from bullmq import Queue, Worker

from actors.bullmq import use_actor_lock_manager
from tests.bullmq.harness import _BULLMQ_IDLE_WAIT, _stuck_coroutines

#: BullMQ's default key prefix.
PREFIX = "bull"
#: Jobs per ``Queue.addBulk`` call while the queue is filled.
ADD_CHUNK = 500
#: Longest wait, in seconds, for each phase's jobs to complete: a bound for a
#: process whose test is gone (the test kills it much sooner).
RUN_S = 600.0
#: Longest wait, in seconds, for the worker's close before the process gives it up.
CLOSE_S = 5.0
#: The contenders, by name: ``None`` is a stock worker, otherwise the isolation.
ISOLATIONS: dict[str, str | None] = {"stock": None, "thread": "thread", "process": "process"}
#: The worker events counted besides ``completed``: none is expected.
COUNTED = ("failed", "stalled", "error", "lockRenewalFailed")


def key(queue: str, *parts: str) -> str:
    """``bull:{queue}:{parts...}``."""
    return ":".join((PREFIX, queue, *parts))


@dataclass
class RunResult:
    """What one contender's process measured."""

    #: Seconds from ``worker.run()`` to the throughput phase's last ``completed`` event.
    seconds: float
    #: Seconds from ``worker.run()`` to the first processor start.
    first_start_s: float
    #: Seconds the lock manager's start took, before the clock started (0 for stock).
    manager_start_s: float
    #: Seconds from add to processor start, one per run of a waits-phase job.
    waits: list[float]
    #: Processor runs in all.
    runs: int
    #: Runs of a job that had run before.
    repeats: int
    #: How many of each of :data:`COUNTED` the worker emitted.
    events: dict[str, int] = field(default_factory=dict)


@dataclass
class CloseResult:
    """How the worker's close went."""

    #: Seconds from ``worker.close()`` to the end of its ``run()`` (or to giving up).
    seconds: float
    #: Whether it ended within :data:`CLOSE_S`.
    closed: bool
    #: The coroutines of the tasks left on the loop when it was given up.
    waiting: list[str] = field(default_factory=list)
    #: Whether they all wait where bullmq-py's own idle close hangs.
    bullmq_idle_wait: bool = False


class Completions:
    """Counts the worker's ``completed`` events; wakes a waiter at a target count."""

    def __init__(self) -> None:
        self.count = 0
        self.reached_at: dict[int, float] = {}
        self._targets: dict[int, asyncio.Event] = {}

    def on_completed(self, *_: Any) -> None:
        self.count += 1
        if self.count in self._targets:
            self.reached_at[self.count] = time.perf_counter()
            self._targets[self.count].set()

    def target(self, count: int) -> asyncio.Event:
        """An event set once ``count`` jobs completed (ask before they can)."""
        return self._targets.setdefault(count, asyncio.Event())


async def fill(url: str, queue: str, jobs: int) -> None:
    """Add ``jobs`` jobs with empty data, in chunks of :data:`ADD_CHUNK`."""
    adder = Queue(queue, {"connection": url, "prefix": PREFIX})
    try:
        for start in range(0, jobs, ADD_CHUNK):
            count = min(ADD_CHUNK, jobs - start)
            await adder.addBulk([{"name": "tiny", "data": {}} for _ in range(count)])
    finally:
        await adder.close()


async def add_steadily(url: str, queue: str, jobs: int, rate: float) -> None:
    """Add ``jobs`` jobs one by one, the i-th due at ``i / rate`` s, each with its add time.

    An add that comes late is made at once: the schedule does not slip.
    """
    adder = Queue(queue, {"connection": url, "prefix": PREFIX})
    try:
        began = time.monotonic()
        for i in range(jobs):
            ahead = began + i / rate - time.monotonic()
            if ahead > 0:
                await asyncio.sleep(ahead)
            await adder.add("timed", {"added": time.time()})
    finally:
        await adder.close()


async def close(worker: Any, running: asyncio.Future[Any]) -> CloseResult:
    """Close ``worker`` and wait for its ``run()``, giving up after :data:`CLOSE_S`."""
    began = time.perf_counter()
    try:
        await asyncio.wait_for(asyncio.shield(worker.close()), CLOSE_S)
        await asyncio.wait_for(running, CLOSE_S)
    except asyncio.TimeoutError:
        stuck = _stuck_coroutines()
        return CloseResult(
            time.perf_counter() - began, False, sorted(stuck), stuck <= _BULLMQ_IDLE_WAIT
        )
    return CloseResult(time.perf_counter() - began, True)


async def main(
    url: str, queue: str, contender: str, concurrency: int, jobs: int, wait_jobs: int
) -> None:
    """Fill the queue, time the worker through it, then through the steady adds; close."""
    isolation = ISOLATIONS[contender]
    await fill(url, queue, jobs)

    waits: list[float] = []
    started: Counter[str] = Counter()
    first_start: list[float] = []

    async def process(job: Any, token: str) -> None:
        added = job.data.get("added")
        if added is not None:
            waits.append(time.time() - added)
        if not first_start:
            first_start.append(time.perf_counter())
        started[str(job.id)] += 1

    worker = Worker(
        queue,
        process,
        {"connection": url, "prefix": PREFIX, "concurrency": concurrency, "autorun": False},
    )
    completions = Completions()
    worker.on("completed", completions.on_completed)
    events: Counter[str] = Counter()
    for name in COUNTED:
        worker.on(name, lambda *_, name=name: events.update([name]))
    manager_start_s = 0.0
    if isolation is not None:
        installed = use_actor_lock_manager(worker, isolation=isolation)
        # Started here, not by run() (a start is idempotent): a process-mode
        # manager spawns its child, a one-off cost kept off the clock.
        began = time.perf_counter()
        installed.start()
        manager_start_s = time.perf_counter() - began
    filled = completions.target(jobs)
    done = completions.target(jobs + wait_jobs)

    began = time.perf_counter()
    running = asyncio.ensure_future(worker.run())
    await asyncio.wait_for(filled.wait(), RUN_S)
    seconds = completions.reached_at[jobs] - began
    client = redis.asyncio.Redis.from_url(url)
    try:
        await client.set(key(queue, "bench-ready"), "1")
    finally:
        await client.aclose()
    await asyncio.wait_for(done.wait(), RUN_S)
    result = RunResult(
        seconds=seconds,
        first_start_s=first_start[0] - began,
        manager_start_s=manager_start_s,
        waits=waits,
        runs=sum(started.values()),
        repeats=sum(count - 1 for count in started.values()),
        events=dict(events),
    )
    print(json.dumps(asdict(result)), flush=True)

    closed = await close(worker, running)
    print(json.dumps(asdict(closed)), flush=True)
    if not closed.closed:
        # No job is left: leave without waiting for the hung close (a
        # process-mode manager's child sees its worker gone and exits).
        os._exit(0)


if __name__ == "__main__":
    url, queue, contender, concurrency, jobs, wait_jobs = sys.argv[1:7]
    asyncio.run(main(url, queue, contender, int(concurrency), int(jobs), int(wait_jobs)))
