"""How a bullmq worker's lock manager closes: when it may, and what it stops.

A graceful close goes on renewing until every run the worker processes has
been moved; then the manager, the fetch thread, the lock reader and the
clients built for them are stopped off the worker's loop, on a thread that
has ended when the close returns.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import TYPE_CHECKING, Any

import pykka

from actors.api import stop

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    import redis

    from actors.bullmq._hooks import Fetcher
    from actors.bullmq._runs import Run
    from actors.ref import ManagerRef

__all__ = ["attempt", "must_wait", "off_the_loop", "stopper"]

#: Longest wait for the manager to stop when the worker closes, in seconds.
_STOP_S = 10.0


def must_wait(worker: Any, runs: Iterable[Run]) -> bool:
    """Whether a graceful close must go on renewing: a run is still to be moved."""
    if getattr(worker, "forceClosing", False):
        return False
    running = bool(getattr(worker, "running", False))
    # The worker's own processing tasks: a run tracked by other code (a
    # test, a tool) is not the worker's to finish.
    processing = getattr(worker, "processing", ())
    for run in runs:
        if run.task is not None and not run.task.done() and run.task in processing:
            return True
        # Fetched, not yet processed: run() processes it while it runs.
        if run.task is None and running:
            return True
    return False


def stopper(
    name: str,
    manager: ManagerRef | None,
    fetcher: Fetcher | None,
    reader: concurrent.futures.ThreadPoolExecutor | None,
    conn: redis.Redis | redis.RedisCluster | None,
) -> Callable[[], None]:
    """Return what stops the given threads and closes ``conn``, to run off the loop."""

    def release() -> None:
        if fetcher is not None:
            fetcher.close()
        if reader is not None:
            reader.shutdown(wait=True)
        if manager is not None:
            try:
                stop(manager, timeout=_STOP_S)
            except pykka.Timeout:
                # The worker's close must end: say so, and leave the
                # manager's daemon threads to the process.
                raise TimeoutError(
                    f"the lock manager of queue {name!r} did not stop within {_STOP_S:.0f} s"
                ) from None
        if conn is not None:
            conn.close()

    return release


async def off_the_loop(name: str, action: Callable[[], None]) -> BaseException | None:
    """Run ``action`` on a thread of its own, ended when this returns; return what it raised."""
    closer = concurrent.futures.ThreadPoolExecutor(1, f"bullmq-close-{name}")
    try:
        return await asyncio.wrap_future(closer.submit(attempt, action))
    finally:
        closer.shutdown(wait=True)


def attempt(action: Callable[[], None]) -> BaseException | None:
    """Run ``action``; return the error it raised, if any."""
    try:
        action()
    except Exception as error:
        return error
    return None
