"""The manager's queries for asyncio code, awaited without blocking the loop.

A pykka future's ``__await__`` calls the blocking ``get()``, which stops the
whole loop until the manager answers. The coroutines here ask with
``block=False`` and the answer calls back into the loop (see :func:`answer`),
so other tasks keep running and no thread waits.

Example:
    >>> from actors import aio
    >>> stats = await aio.get_stats(manager)
    >>> await aio.untrack_job(manager, "42")      # returns once untracked

:func:`actors.track_job` returns at once and needs no coroutine; an ``async``
job holds its lock with ``async with actors.lease(...)``.
"""

from __future__ import annotations

import asyncio
import functools
from typing import TYPE_CHECKING, Any, TypeVar, cast

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

    The manager's own futures (:class:`~actors.ref.Answer`) call back into
    the loop when answered; any other pykka future is polled, at most
    :data:`POLL_S` apart. An answer that never comes holds up only this task.

    ``future`` is what ``manager.ask(message, block=False)`` returned;
    ``timeout`` is in seconds (``None``: as long as it takes).

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
        future._on_set(functools.partial(_wake, loop, waiter))
    else:
        _look(loop, waiter, future, 0.001)
    if timeout is None:
        return await waiter
    try:
        return await asyncio.wait_for(waiter, timeout)
    except asyncio.TimeoutError:
        raise pykka.Timeout(f"{timeout} seconds") from None


def _wake(loop: asyncio.AbstractEventLoop, waiter: asyncio.Future[T], done: Answer[T]) -> None:
    # On the thread that answered; a loop closed since has nobody left to tell.
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

    ``message`` is one of :mod:`actors.messages`; ``timeout`` is in seconds.

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

    The awaitable form of ``untrack_job(manager, job_id, wait=True)`` (see
    :func:`actors.untrack_job`): after it the job may delete its lock.

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
    """Await how many jobs ``manager`` tracks; raises as :func:`actors.get_active_job_count`."""
    return cast("int", await ask(manager, GetActiveJobCount(), timeout=timeout))


async def get_tracked_job_ids(manager: ManagerRef, *, timeout: float | None = None) -> list[str]:
    """Await the ids ``manager`` tracks; raises as :func:`actors.get_tracked_job_ids`."""
    return cast("list[str]", await ask(manager, GetTrackedJobIds(), timeout=timeout))


async def is_tracked(manager: ManagerRef, job_id: str, *, timeout: float | None = None) -> bool:
    """Await whether ``manager`` tracks ``job_id``; raises as :func:`actors.is_tracked`."""
    return cast("bool", await ask(manager, IsTracked(job_id), timeout=timeout))


async def get_stats(manager: ManagerRef, *, timeout: float | None = None) -> Stats:
    """Await ``manager``'s counters; raises as :func:`actors.get_stats`."""
    return cast("Stats", await ask(manager, GetStats(), timeout=timeout))


async def stop(manager: ManagerRef, *, timeout: float | None = None) -> bool:
    """Stop ``manager`` and return once it is fully stopped; as :func:`actors.stop`."""
    ref = require_manager(manager)
    if on_a_delivery_thread():
        # In a callback's own loop: the stop waits only for the manager's thread.
        return cast("bool", ref.stop(timeout=timeout))
    return bool(await asyncio.to_thread(ref.stop, timeout=timeout))


def call_in_loop(
    loop: asyncio.AbstractEventLoop, callback: Callable[..., object], *args: object
) -> bool:
    """Schedule ``callback(*args)`` on ``loop`` from any thread; ``False`` if the loop is closed.

    Calls handed over from one thread run in the order they were handed over.
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
