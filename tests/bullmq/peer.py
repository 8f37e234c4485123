"""A bullmq-py worker in a process of its own: it checks for stalled jobs and takes them.

Run by the tests as ``python peer.py URL QUEUE NAME OPTIONS_JSON``. Its
processor and its ``stalled`` events leave their trace in Redis (lists beside
the queue's keys), where the test reads them; it stops when the test sets its
stop key. With ``"paused": true`` among its options it takes no job and only
checks for stalled ones. With ``"actor": "thread"`` or ``"process"`` its locks are renewed by
``use_actor_lock_manager`` in that mode, and with ``"hold_s": S`` each run holds its job S
seconds (a run is traced once the renewing side holds its lock). With ``"stop_at_start": true``
its processor stops its own process (SIGSTOP) as it starts, and once continued traces what its
first look at ``signal.aborted`` read (``bull:{queue}:peer-reads``). A process of its own, as a
real second worker is: a processor that blocks the first worker's loop (or holds its GIL)
cannot slow this one down.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import redis.asyncio
from bullmq import Worker

# The project's root: the harness's close, which tells bullmq's idle-close hang from others.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from actors import ExtendLocks
from actors.bullmq import ActorLockManager, use_actor_lock_manager
from tests.bullmq.harness import HUNG, close_worker

PREFIX = "bull"


def key(queue: str, *parts: str) -> str:
    """``bull:{queue}:{parts...}``."""
    return ":".join((PREFIX, queue, *parts))


async def main(url: str, queue: str, name: str, options: dict[str, Any]) -> None:
    """Run one worker until the test sets ``bull:{queue}:peer-stop:{name}``."""
    client = redis.asyncio.Redis.from_url(url, decode_responses=True)

    isolation = options.pop("actor", None)
    hold_s = options.pop("hold_s", 0)
    installed: ActorLockManager | None = None

    async def process(job: Any, token: str) -> str:
        if installed is not None and installed.manager is not None:
            # Answered once the renewing side ran a renewal: it holds the job's lock by then.
            manager = installed.manager
            await asyncio.get_running_loop().run_in_executor(
                None, lambda: manager.ask(ExtendLocks(), timeout=30)
            )
        # CLOCK_MONOTONIC is one clock for every process of the machine.
        await client.rpush(key(queue, "peer-runs"), f"{name}|{token}|{time.monotonic()}")
        await asyncio.sleep(hold_s)
        return name

    async def stop_at_start(job: Any, token: str, abort: Any) -> str:
        # Paused as the run starts, before its first look: the whole process, every thread.
        os.kill(os.getpid(), signal.SIGSTOP)
        aborted = abort.aborted  # the first look once continued, before any await
        await client.rpush(key(queue, "peer-reads"), f"{name}|{token}|{aborted}|{abort.reason}")
        return name

    paused = options.pop("paused", False)
    processor = stop_at_start if options.pop("stop_at_start", False) else process
    worker = Worker(
        queue, processor, {"connection": url, "prefix": PREFIX, **options, "autorun": False}
    )
    if isolation is not None:
        installed = use_actor_lock_manager(worker, isolation=isolation)
    if paused:
        await worker.pause()
    running = asyncio.ensure_future(worker.run())
    stalled: list[str] = []
    worker.on("stalled", lambda job_id, *_: stalled.append(str(job_id)))
    await client.set(key(queue, "peer-ready", name), "1")
    while not await client.exists(key(queue, "peer-stop", name)):
        while stalled:
            await client.rpush(key(queue, "peer-stalled"), stalled.pop(0))
        await asyncio.sleep(0.02)
    hung = await close_worker(worker, running)
    if hung:
        # A close that hung, not in bullmq's own idle wait: the test hears of it.
        sys.stderr.write("".join(hung))
        os._exit(HUNG)
    while stalled:
        await client.rpush(key(queue, "peer-stalled"), stalled.pop(0))
    await client.aclose()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])))
