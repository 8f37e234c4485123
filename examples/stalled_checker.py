"""A stalled-check-only peer for tests: BullMQ's stalled check, run as a worker runs it.

Any BullMQ worker, in any language, runs the stalled check every ``stalledInterval``: it
moves back to wait (or to failed, past ``maxStalledCount``) the active jobs whose lock
is gone. A test that wants "another worker" to take a job whose lock lapsed needs only
that check. :class:`StalledChecker` runs it from a bullmq-py ``Worker`` that has no
processor and never runs, so it takes no job and renews no lock, on an event loop of
its own thread: a processor that blocks the test's loop cannot delay it.

Run it with ``python examples/stalled_checker.py`` (``REDIS_URL``, or a private server).
"""

from __future__ import annotations

import asyncio
import threading
from typing import TYPE_CHECKING, Any

from bullmq import Queue, Worker

import actors
from actors.embedded import server_url

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import TracebackType

__all__ = ["StalledChecker", "add", "fetch", "state"]

LOCK_MS = 1000  #: The jobs' lock TTL, in milliseconds: short, so the example ends in seconds.


# --8<-- [start:checker]
class StalledChecker:
    """BullMQ's stalled check on one queue, every ``interval_ms``, until stopped.

    Use it as a context manager. The first check runs at once, each next one
    ``interval_ms`` after the last ended (the check's own throttle key lives that
    long, so none is skipped). Another worker's check on the same queue within the
    interval makes one of them do nothing, as between any two BullMQ workers.

    Args:
        url: The server's URL.
        queue: The queue's name.
        prefix: The queue's key prefix (BullMQ's default, ``"bull"``).
        interval_ms: BullMQ's ``stalledInterval``: milliseconds between checks.
        max_stalled_count: BullMQ's ``maxStalledCount``: how many times a job may
            stall before a check moves it to failed.
    """

    def __init__(
        self,
        url: str,
        queue: str,
        *,
        prefix: str = "bull",
        interval_ms: int = 500,
        max_stalled_count: int = 1,
    ) -> None:
        self.interval_ms = interval_ms
        #: Every job id a check reported stalled, in order.
        self.stalled: list[str] = []
        #: How many checks have ended.
        self.checks = 0
        self._options = {
            "connection": url,
            "prefix": prefix,
            "autorun": False,
            "stalledInterval": interval_ms,
            "maxStalledCount": max_stalled_count,
        }
        self._queue = queue
        self._errors: list[object] = []
        self._changed = threading.Condition()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name=f"stalled-checker-{queue}", daemon=True
        )
        self._worker: Any = None
        self._task: asyncio.Future[None] | None = None

    def __enter__(self) -> StalledChecker:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=30)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        self._loop.close()

    def wait_stalled(self, job_id: str, timeout: float) -> None:
        """Wait until a check reports ``job_id`` stalled.

        Raises:
            TimeoutError: No check reported it within ``timeout`` seconds.
        """
        self._wait(lambda: job_id in self.stalled, timeout, f"job {job_id} reported stalled")

    def wait_checks(self, count: int, timeout: float) -> None:
        """Wait until ``count`` checks have ended since the checker started.

        Raises:
            TimeoutError: Fewer ended within ``timeout`` seconds.
        """
        self._wait(lambda: self.checks >= count, timeout, f"{count} checks")

    def _wait(self, done: Callable[[], bool], timeout: float, what: str) -> None:
        with self._changed:
            if not self._changed.wait_for(lambda: done() or bool(self._errors), timeout):
                raise TimeoutError(f"{what}: not within {timeout} s ({self.checks} checks ran)")
            if self._errors:
                error = self._errors[0]
                raise RuntimeError(f"the stalled check failed: {type(error).__name__}: {error}")

    async def _start(self) -> None:
        self._worker = Worker(self._queue, None, self._options)
        self._worker.on("stalled", self._on_stalled)
        self._worker.on("error", self._on_error)
        self._task = asyncio.ensure_future(self._check_every_interval())

    async def _check_every_interval(self) -> None:
        while True:
            # bullmq-py's check reports through the worker's events, never by raising.
            await self._worker.runStalledJobsCheck()
            with self._changed:
                self.checks += 1
                self._changed.notify_all()
            await asyncio.sleep(self.interval_ms / 1000)

    async def _stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self._worker.close()

    def _on_stalled(self, job_id: object, *_: object) -> None:
        with self._changed:
            self.stalled.append(str(job_id))
            self._changed.notify_all()

    def _on_error(self, error: object, *_: object) -> None:
        with self._changed:
            self._errors.append(error)
            self._changed.notify_all()


# --8<-- [end:checker]


async def add(url: str, queue: str) -> str:
    """Add a job to the queue, as a producer does; return its id."""
    jobs = Queue(queue, {"connection": url})
    try:
        return str((await jobs.add("render", {"pages": 3})).id)
    finally:
        await jobs.close()


async def fetch(url: str, queue: str, lock_ms: int = LOCK_MS) -> tuple[str, str]:
    """Take the next waiting job as a worker's fetch does, then walk away.

    The job's lock is taken for ``lock_ms`` and nobody renews it. Returns the job's id
    and the lock's token.
    """
    worker = Worker(queue, None, {"connection": url, "autorun": False, "lockDuration": lock_ms})
    try:
        token = f"{worker.id}:1"
        job = await worker.getNextJob(token)
        assert job is not None, f"no job waiting in {queue!r}"
        return str(job.id), token
    finally:
        await worker.close()


async def state(url: str, queue: str, job_id: str) -> str:
    """The job's state, as BullMQ's ``getJobState`` reads it."""
    jobs = Queue(queue, {"connection": url})
    try:
        return str(await jobs.getJobState(job_id))
    finally:
        await jobs.close()


def main() -> int:
    """Take two jobs, renew one of them; the checker hands the other back to wait."""
    with server_url() as url, StalledChecker(url, "pictures", interval_ms=250) as checker:
        # Step 1: two jobs taken by a worker that then stops renewing (it hung, it died).
        for _ in range(2):
            asyncio.run(add(url, "pictures"))
        dropped, _ = asyncio.run(fetch(url, "pictures"))
        kept, token = asyncio.run(fetch(url, "pictures"))
        # Step 2: one lock renewed by a manager; the other is left to expire.
        keys = actors.QueueKeys("pictures", prefix="bull")
        manager = actors.start_link(connection=url, keys=keys, lock_duration=LOCK_MS)
        actors.track_job(manager, kept, token)
        # Step 3: the checker finds the lapsed lock and hands its job back to wait...
        checker.wait_stalled(dropped, timeout=10 * LOCK_MS / 1000)
        # ...and goes on checking for two more TTLs, leaving the renewed job alone.
        checker.wait_checks(checker.checks + 2 * LOCK_MS // checker.interval_ms, timeout=30)
        actors.stop(manager)
        print(f"job {dropped}: stalled, now {asyncio.run(state(url, 'pictures', dropped))}")
        print(f"job {kept}: renewed, now {asyncio.run(state(url, 'pictures', kept))}")
        print(f"reported stalled: {checker.stalled}")
    return 0 if checker.stalled == [dropped] else 1


if __name__ == "__main__":
    raise SystemExit(main())
