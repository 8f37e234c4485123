"""A bullmq worker whose processor blocks its event loop, and keeps its lock anyway.

bullmq-py renews locks from a task on the worker's loop: without step 2 the
lock runs out during the sleep, the worker cannot complete the job ("Missing
lock for job 1") and a stalled check runs it again. ``use_actor_lock_manager``
renews from a thread: the job runs once. A lost lock aborts the signal.

Run it with ``python examples/bullmq_worker.py``; it uses ``REDIS_URL`` or
starts a private server.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from bullmq import Queue, Worker
from bullmq.abort_controller import AbortError

import actors
from actors.bullmq import use_actor_lock_manager
from actors.embedded import server_url

__all__ = ["main", "run"]


async def run(url: str, lock_ms: int = 1000) -> dict[str, Any]:
    """Process one job that blocks the loop for three lock durations; return what BullMQ saw."""

    async def process(job: Any, token: str, signal: Any) -> str:
        # Blocking work: bullmq-py's own renewal could not run meanwhile.
        time.sleep(3 * lock_ms / 1000)
        # The signal says whether the lock was lost while we worked.
        if signal.aborted:
            raise AbortError(signal.reason)
        return "rendered"

    # Step 1: a worker that does not start by itself,
    worker = Worker(
        "reports", process, {"connection": url, "autorun": False, "lockDuration": lock_ms}
    )
    # Step 2: its locks renewed from a thread, installed before it runs.
    locks = use_actor_lock_manager(worker)
    done = asyncio.Event()
    worker.on("completed", lambda job, result: done.set())
    worker.on("failed", lambda job, error: done.set())
    running = asyncio.ensure_future(worker.run())

    # Step 3: add a job and wait for its end; the manager counted the renewals.
    queue = Queue("reports", {"connection": url})
    job = await queue.add("render", {"pages": 3})
    await asyncio.wait_for(done.wait(), 10 * lock_ms / 1000)
    assert locks.manager is not None
    stats = actors.get_stats(locks.manager, timeout=5)

    # Step 4: read the job back as any BullMQ runtime would see it.
    seen = await queue.getJob(job.id)
    await worker.close()
    await running
    await queue.close()
    return {
        "result": seen.returnvalue,
        "attempts_started": seen.attemptsStarted,
        "stalled": seen.stalledCounter,
        "renewals": stats.renewed,
        "lost": stats.lost,
    }


def main() -> int:
    """Run on ``REDIS_URL``, or a private server, and print the job's outcome."""
    with server_url() as url:
        outcome = asyncio.run(run(url))
    print(outcome)
    return 0 if outcome["attempts_started"] == 1 and outcome["lost"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
