"""Waiting for a lease's end: from a thread (:meth:`~LeaseWaits.wait`) or a task (``wait_async``).

A lease ends when its lock is lost (the manager says so, or the lock's
deadline passes) or when it is left. A thread waits on an event; a task
awaits a future of its own loop, which the thread that ends the lease
settles through the loop (``actors._loop``). Both also wake at the
lock's deadline by their own timeout, so a manager stuck in a Redis call is
not waited for.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from typing import TYPE_CHECKING, Protocol

from actors._loop import call_in_loop, set_result

if TYPE_CHECKING:
    import threading

    from actors.lost import LockLost

__all__ = ["LeaseWaits"]


class _Lease(Protocol):
    """What the waits use of the lease."""

    _lock: threading.Lock
    _done: threading.Event
    _waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]]

    @property
    def _tracked(self) -> object: ...

    @property
    def deadline(self) -> int | None: ...

    def _require_entered(self) -> None: ...

    def _current(self) -> LockLost | None: ...

    def _now(self) -> int | None: ...

    def _settle(self, timeout: float | None) -> None: ...

    async def _settle_async(self) -> None: ...

    def _until_deadline(self) -> float | None: ...

    async def _until_done(self) -> None: ...


class LeaseWaits:
    """A lease's :meth:`wait` and :meth:`wait_async`, and the end they wait for."""

    def wait(self: _Lease, timeout: float | None = None) -> bool:
        """Block until the lock is lost or the lease is left, like ``threading.Event.wait``.

        For a watchdog thread beside the job. Not for asyncio code: await
        :meth:`wait_async` there instead.

        Args:
            timeout: Most seconds to wait; ``None`` waits as long as it takes.

        Returns:
            Whether the lock is lost (``False`` on timeout, or when the lease
            was left with its lock held).

        Raises:
            RuntimeError: The lease was never entered.
            ValueError: ``timeout`` is nan.
        """
        self._require_entered()
        _check_timeout(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        if self._current() is None and self._tracked is not None:
            self._settle(timeout)
        # Woken by the manager's word, or at the lock's deadline by this
        # thread's own timeout: a manager stuck in a Redis call is not waited for.
        while self._current() is None and not self._done.is_set():
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                break
            self._done.wait(_shorter(left, self._until_deadline()))
        return self._current() is not None

    async def wait_async(self: _Lease, timeout: float | None = None) -> bool:
        """Await until the lock is lost or the lease is left; the loop keeps running.

        Args:
            timeout: Most seconds to wait; ``None`` waits as long as it takes.

        Returns:
            Whether the lock is lost (``False`` on timeout, or when the lease
            was left with its lock held).

        Raises:
            RuntimeError: The lease was never entered.
            ValueError: ``timeout`` is nan.
        """
        self._require_entered()
        _check_timeout(timeout)
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            left = None if deadline is None else deadline - loop.time()
            if left is not None and left <= 0:
                break
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._until_done(), _shorter(left, self._until_deadline()))
            if self._current() is not None or self._done.is_set():
                break
        return self._current() is not None

    async def _until_done(self: _Lease) -> None:
        if self._current() is None:
            await self._settle_async()
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._done.is_set():
                return
            waiter: asyncio.Future[None] = loop.create_future()
            self._waiters.append((loop, waiter))
        try:
            await waiter
        finally:
            with self._lock, contextlib.suppress(ValueError):
                self._waiters.remove((loop, waiter))

    def _until_deadline(self: _Lease) -> float | None:
        """Seconds until the lock's deadline on the manager's clock, or ``None``."""
        deadline = self.deadline
        now = None if deadline is None else self._now()
        if deadline is None or now is None:
            return None
        # At least a millisecond: the clock counts whole ones.
        return max(deadline - now, 1) / 1000

    def _finish(self: _Lease) -> None:
        # Set under the lock: a task that registers after this finds it set.
        with self._lock:
            self._done.set()
            waiters = self._waiters.copy()
            self._waiters.clear()
        for loop, waiter in waiters:
            # A loop closed since has nobody left to wake.
            call_in_loop(loop, set_result, waiter, None)


def _shorter(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    return a if b is None else min(a, b)


def _check_timeout(timeout: float | None) -> None:
    if timeout is not None and math.isnan(timeout):
        raise ValueError("timeout must be a number of seconds or None, got nan")
