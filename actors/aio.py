"""The manager's queries for asyncio code, awaited without blocking the loop.

A pykka future can be awaited, but its ``__await__`` calls the blocking
``get()``: the whole event loop then stands still until the manager answers,
which during a tick of 100,000 jobs can be a long time. The coroutines here
ask the manager with ``block=False`` and wait for the answer on a thread of
their own (one per manager, see :func:`answer`), so other tasks keep running
meanwhile.

Example:
    >>> from actors import aio
    >>> stats = await aio.get_stats(manager)
    >>> await aio.untrack_job(manager, "42")      # returns once untracked

:func:`actors.track_job` already returns at once and needs no coroutine.
Inside an ``async`` job, hold a lock with ``async with actors.lease(...)``
(see :mod:`actors.leases`), whose exit awaits :func:`untrack_job`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import queue
import threading
import weakref
from typing import TYPE_CHECKING, Any, TypeVar

import pykka

from actors import api
from actors.messages import (
    GetActiveJobCount,
    GetStats,
    GetTrackedJobIds,
    IsTracked,
    UntrackJob,
)
from actors.ref import ManagerRef, ManagerStopped, require_manager

if TYPE_CHECKING:
    from collections.abc import Callable

    from actors.stats import Stats

__all__ = [
    "answer",
    "ask",
    "get_active_job_count",
    "get_stats",
    "get_tracked_job_ids",
    "is_tracked",
    "stop",
    "untrack_job",
]

T = TypeVar("T")


#: Seconds a manager's answer thread waits for more work before it ends.
IDLE_S = 1.0


class _Answers:
    """One thread that reads one manager's answers in the order they were asked.

    A manager answers its mailbox in order, so one thread waiting on each
    answer in turn never waits on one while a later one is ready (answers
    asked from several threads at once can come a little out of order; then
    one waits for its neighbour). One thread per manager, rather than one
    per question: a thousand jobs leaving their leases at once would
    otherwise wake a thousand threads, and the manager's own thread would
    wait its turn for the GIL behind them.
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue[_Pending] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def submit(self, pending: _Pending) -> None:
        with self._lock:
            self._queue.put(pending)
            if self._thread is None:
                thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                thread.start()
                self._thread = thread

    def _run(self) -> None:
        while True:
            try:
                pending = self._queue.get(timeout=IDLE_S)
            except queue.Empty:
                with self._lock:
                    if self._queue.empty():
                        self._thread = None
                        return
                continue
            pending.deliver()


class _Pending:
    """A pykka future, and the asyncio future of the loop that awaits it."""

    __slots__ = ("future", "loop", "waiter")

    def __init__(
        self,
        future: pykka.Future[Any],
        loop: asyncio.AbstractEventLoop,
        waiter: asyncio.Future[Any],
    ) -> None:
        self.future = future
        self.loop = loop
        self.waiter = waiter

    def deliver(self) -> None:
        """Wait for the answer (on the answer thread), then hand it to the loop."""
        try:
            value = self.future.get()
        except BaseException as exc:
            # Whatever it is, it belongs to the awaiting task; this thread
            # must live on to serve the answers queued behind it.
            self._hand(_fail, exc)
        else:
            self._hand(_succeed, value)

    def _hand(self, call: Callable[[asyncio.Future[Any], Any], None], arg: Any) -> None:
        # The loop may have closed since: nobody is left to tell.
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(call, self.waiter, arg)


def _succeed(waiter: asyncio.Future[Any], value: Any) -> None:
    if not waiter.done():
        waiter.set_result(value)


def _fail(waiter: asyncio.Future[Any], error: BaseException) -> None:
    if not waiter.done():
        waiter.set_exception(error)


_answers: weakref.WeakValueDictionary[str, _Answers] = weakref.WeakValueDictionary()
_answers_lock = threading.Lock()


async def answer(
    manager: ManagerRef, future: pykka.Future[T], *, timeout: float | None = None
) -> T:
    """Await the answer to something asked of ``manager`` with ``block=False``.

    A future already answered is read at once; otherwise the manager's answer
    thread waits for it, and the loop goes on meanwhile.

    Args:
        manager: The manager the question was asked of.
        future: What ``manager.ask(message, block=False)`` returned (a future
            of that manager's: its answers are read in the order asked).
        timeout: Most seconds to wait; ``None`` waits as long as it takes.

    Returns:
        The answer.

    Raises:
        pykka.Timeout: No answer within ``timeout`` seconds.
        Exception: Whatever the future holds instead of an answer.
    """
    try:
        return future.get(timeout=0)
    except pykka.Timeout:
        pass
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[T] = loop.create_future()
    urn = manager.actor_urn
    with _answers_lock:
        answers = _answers.get(urn)
        if answers is None:
            answers = _answers[urn] = _Answers(f"LockManager-answers-{manager.queue_name}")
        answers.submit(_Pending(future, loop, waiter))
    if timeout is None:
        return await waiter
    try:
        return await asyncio.wait_for(waiter, timeout)
    except asyncio.TimeoutError:
        raise pykka.Timeout(f"{timeout} seconds") from None


async def ask(manager: ManagerRef, message: Any, *, timeout: float | None = None) -> Any:
    """Send ``message`` to ``manager`` and await its answer.

    Args:
        manager: The manager.
        message: One of :mod:`actors.messages` (checked in this thread).
        timeout: Most seconds to wait for the answer.

    Returns:
        The manager's answer.

    Raises:
        TypeError: ``manager`` is not a manager's reference, or the message
            has bad arguments.
        ValueError: Likewise, for values out of range.
        ManagerStopped: The manager is stopped, or stopped before answering.
        pykka.Timeout: No answer within ``timeout`` seconds.
    """
    ref = require_manager(manager)
    try:
        return await answer(ref, ref.ask(message, block=False), timeout=timeout)
    except ManagerStopped:
        raise
    except pykka.ActorDeadError:
        # The manager stopped with the message still in its mailbox.
        raise ref.stopped_error() from None


async def untrack_job(
    manager: ManagerRef, job_id: str, *, token: str | None = None, timeout: float | None = None
) -> None:
    """Stop renewing ``job_id``'s lock; return once the manager has untracked it.

    The awaitable form of ``untrack_job(manager, job_id, wait=True)``: after
    it returns no tick can find the lock gone and report it lost, so the job
    may delete its lock. A stopped manager tracks nothing: it returns at once.

    Args:
        manager: The manager.
        job_id: The job's id.
        token: Untrack only the lock holding this token.
        timeout: Most seconds to wait.

    Raises:
        TypeError: ``job_id`` is not a ``str``.
        ValueError: ``job_id`` is empty, too long or not UTF-8.
        pykka.Timeout: No answer within ``timeout`` seconds.
    """
    ref = require_manager(manager)
    message = UntrackJob(job_id, token)
    try:
        await ask(ref, message, timeout=timeout)
    except ManagerStopped:
        ref.ignored("untrack_job")


async def get_active_job_count(manager: ManagerRef, *, timeout: float | None = None) -> int:
    """Await how many jobs ``manager`` tracks.

    Raises:
        ManagerStopped: The manager is stopped.
        pykka.Timeout: No answer within ``timeout`` seconds.
    """
    count: int = await ask(manager, GetActiveJobCount(), timeout=timeout)
    return count


async def get_tracked_job_ids(manager: ManagerRef, *, timeout: float | None = None) -> list[str]:
    """Await the ids ``manager`` tracks.

    Raises:
        ManagerStopped: The manager is stopped.
        pykka.Timeout: No answer within ``timeout`` seconds.
    """
    ids: list[str] = await ask(manager, GetTrackedJobIds(), timeout=timeout)
    return ids


async def is_tracked(manager: ManagerRef, job_id: str, *, timeout: float | None = None) -> bool:
    """Await whether ``manager`` tracks ``job_id``.

    Raises:
        TypeError: ``job_id`` is not a ``str``.
        ValueError: ``job_id`` is empty, too long or not UTF-8.
        ManagerStopped: The manager is stopped.
        pykka.Timeout: No answer within ``timeout`` seconds.
    """
    tracked: bool = await ask(manager, IsTracked(job_id), timeout=timeout)
    return tracked


async def get_stats(manager: ManagerRef, *, timeout: float | None = None) -> Stats:
    """Await ``manager``'s counters.

    Raises:
        ManagerStopped: The manager is stopped.
        pykka.Timeout: No answer within ``timeout`` seconds.
    """
    stats: Stats = await ask(manager, GetStats(), timeout=timeout)
    return stats


async def stop(manager: ManagerRef, *, timeout: float | None = None) -> None:
    """Stop ``manager`` and return once it is fully stopped (see :func:`actors.stop`).

    Raises:
        pykka.Timeout: Not stopped within ``timeout`` seconds.
    """
    ref = require_manager(manager)
    if ref.on_own_thread():
        # From a callback: the manager stops after the current message, and
        # no other thread may wait for it to finish the message it is in.
        api.stop(ref)
        return
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, functools.partial(api.stop, ref, timeout=timeout))
