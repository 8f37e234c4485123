"""The manager's queries for asyncio code, awaited without blocking the loop.

A pykka future can be awaited, but its ``__await__`` calls the blocking
``get()``: the whole event loop then stands still until the manager answers,
which during a tick of 100,000 jobs can be a long time. The coroutines here
ask the manager with ``block=False``; its answer calls back into the loop
(see :func:`answer`), so other tasks keep running meanwhile, no thread waits
on any answer, and an answer that never comes holds up nothing but the task
that awaits it.

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
import functools
from typing import TYPE_CHECKING, Any, TypeVar

import pykka

from actors.messages import GetActiveJobCount, GetStats, GetTrackedJobIds, IsTracked, UntrackJob
from actors.ref import Answer, ManagerRef, ManagerStopped, require_manager
from actors.report import on_a_delivery_thread

if TYPE_CHECKING:
    from collections.abc import Callable

    from actors.messages import Notify
    from actors.report import Stats

__all__ = [
    "answer",
    "ask",
    "call_in_loop",
    "get_active_job_count",
    "get_stats",
    "get_tracked_job_ids",
    "is_tracked",
    "set_exception",
    "set_result",
    "stop",
    "untrack_job",
]

T = TypeVar("T")


#: Longest pause, in seconds, between two looks at a future that cannot call back.
POLL_S = 0.05


async def answer(
    manager: ManagerRef, future: pykka.Future[T], *, timeout: float | None = None
) -> T:
    """Await the answer to something asked of ``manager`` with ``block=False``.

    A future already answered is read at once. The manager's own futures
    (:class:`~actors.ref.Answer`) call back into the loop when answered; any
    other pykka future is looked at again and again, at most
    :data:`POLL_S` apart. Either way nothing blocks: an answer that never
    comes holds up only the task awaiting it, never the other questions.

    Args:
        manager: The manager the question was asked of.
        future: What ``manager.ask(message, block=False)`` returned.
        timeout: Most seconds to wait; ``None`` waits as long as it takes.

    Returns:
        The answer.

    Raises:
        pykka.Timeout: No answer within ``timeout`` seconds.
        Exception: Whatever the future holds instead of an answer.
    """
    require_manager(manager)
    try:
        return future.get(timeout=0)
    except pykka.Timeout:
        pass
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[T] = loop.create_future()
    if isinstance(future, Answer):
        future.add_done_callback(functools.partial(_wake, loop, waiter))
    else:
        _look(loop, waiter, future, 0.001)
    if timeout is None:
        return await waiter
    try:
        return await asyncio.wait_for(waiter, timeout)
    except asyncio.TimeoutError:
        raise pykka.Timeout(f"{timeout} seconds") from None


def _wake(loop: asyncio.AbstractEventLoop, waiter: asyncio.Future[T], done: Answer[T]) -> None:
    # On the thread that answered (the manager's): hand the answer to the loop.
    # The loop may have closed since: nobody is left to tell.
    call_in_loop(loop, _settle, waiter, done)


def _settle(waiter: asyncio.Future[T], future: pykka.Future[T]) -> bool:
    """Pass the answer of ``future`` on to ``waiter``; whether there was one yet."""
    if waiter.done():  # the task gave up (a timeout, a cancel)
        return True
    try:
        value = future.get(timeout=0)
    except pykka.Timeout:
        return False
    except BaseException as exc:
        # Whatever it is, it belongs to the awaiting task.
        set_exception(waiter, exc)
    else:
        set_result(waiter, value)
    return True


def _look(
    loop: asyncio.AbstractEventLoop,
    waiter: asyncio.Future[T],
    future: pykka.Future[T],
    pause: float,
) -> None:
    if not _settle(waiter, future):
        loop.call_later(pause, _look, loop, waiter, future, min(2 * pause, POLL_S))


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
        raise ref._stopped() from None


async def untrack_job(
    manager: ManagerRef,
    job_id: str,
    *,
    token: str | None = None,
    notify: Notify | None = None,
    timeout: float | None = None,
) -> None:
    """Stop renewing ``job_id``'s lock; return once the manager has untracked it.

    The awaitable form of ``untrack_job(manager, job_id, wait=True)``: after
    it returns no tick can find the lock gone and report it lost, so the job
    may delete its lock. A stopped manager tracks nothing: it returns at once.

    Args:
        manager: The manager.
        job_id: The job's id.
        token: Untrack only the lock holding this token.
        notify: End only the claim this target made (see
            :func:`actors.untrack_job`).
        timeout: Most seconds to wait.

    Raises:
        TypeError: ``job_id`` is not a ``str``, or ``notify`` has no ``tell``.
        ValueError: ``job_id`` is empty, too long or not UTF-8.
        pykka.Timeout: No answer within ``timeout`` seconds.
    """
    ref = require_manager(manager)
    message = UntrackJob(job_id, token, notify)
    try:
        await ask(ref, message, timeout=timeout)
    except ManagerStopped:
        ref._ignored(message.operation)


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


async def stop(manager: ManagerRef, *, timeout: float | None = None) -> bool:
    """Stop ``manager`` and return once it is fully stopped (see :func:`actors.stop`).

    Returns:
        ``True`` for the one call that stopped the manager, ``False`` for any other.

    Raises:
        pykka.Timeout: Not stopped within ``timeout`` seconds.
    """
    ref = require_manager(manager)
    if on_a_delivery_thread():
        # In a callback's own loop: the stop waits for the manager's thread
        # only, which runs no user code.
        stopped: bool = ref.stop(timeout=timeout)
        return stopped
    return bool(await asyncio.to_thread(ref.stop, timeout=timeout))


# -- handing work to a loop ---------------------------------------------------------


def call_in_loop(
    loop: asyncio.AbstractEventLoop, callback: Callable[..., object], *args: object
) -> bool:
    """Schedule ``callback(*args)`` on ``loop`` from any thread, unless the loop is closed.

    Calls handed over from one thread run in the order they were handed over.

    Returns:
        Whether the call was handed over: ``False`` when the loop has closed
        and nobody is left to run it.
    """
    try:
        loop.call_soon_threadsafe(callback, *args)
    except RuntimeError:
        return False
    return True


def set_result(waiter: asyncio.Future[T], value: T) -> None:
    """Set ``waiter``'s result unless it is done already (its task gave up, or was cancelled)."""
    if not waiter.done():
        waiter.set_result(value)


def set_exception(waiter: asyncio.Future[T], exc: BaseException) -> None:
    """Set ``waiter``'s exception unless it is done already."""
    if not waiter.done():
        waiter.set_exception(exc)
