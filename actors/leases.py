"""Leases: a job holds its lock for the length of a block, and learns when it is lost.

Entering tracks the job (the manager answers at once); leaving untracks it and
waits until the manager has let it go, so no tick can report the released lock
lost. The manager tells the lease once if the lock is lost, and the job sees it
at once::

    with actors.lease(manager, job_id, token) as held:
        for step in steps:
            held.check()            # raises LockLost once the lock is lost
            do(step)

    async with actors.lease(manager, job_id, token) as held:
        work = asyncio.ensure_future(do_work())
        await asyncio.wait({work, asyncio.ensure_future(held.wait_async())},
                           return_when=asyncio.FIRST_COMPLETED)
        if held.lost:
            work.cancel()           # another worker owns the job now

A leased lock is checked at every tick. Past its deadline, ``lock_duration -
safety_margin`` after the last confirmed renewal's send, it is lost as
``"unconfirmed"``, before the server can expire it. Leaving the block never
raises for a lost lock. A lease is one claim among others on its lock: only
its exit, the loss, its ``max_hold`` or the manager's stop end it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import threading
import time
from typing import TYPE_CHECKING, Any, TypeVar

import pykka

from actors.aio import answer, ask, call_in_loop, set_result
from actors.fencing import fence
from actors.jobs import Validity
from actors.messages import MANAGER_STOPPED, UNCONFIRMED, LockLost, TrackJob, UntrackJob
from actors.ref import ManagerRef, ManagerStopped, require_manager

if TYPE_CHECKING:
    from actors.messages import Reason

__all__ = ["Lease", "lease"]

logger = logging.getLogger("actors.leases")

_L = TypeVar("_L", bound="Lease")

# A lease's life: built, entered (the manager renews its lock), left.
_NEW, _HELD, _CLOSED = "new", "held", "closed"


def lease(
    manager: ManagerRef,
    job_id: str,
    token: str,
    max_hold: int | None = None,
    *,
    ts: int | None = None,
    safety_margin: int | None = None,
) -> Lease:
    """Return a :class:`Lease` on ``job_id``'s lock for a ``with`` (or ``async with``) block.

    The arguments, and what they raise, are those of :class:`Lease`.

    Example:
        >>> with lease(manager, "42", token) as held:
        ...     held.check()          # raises LockLost once the lock is lost
    """
    return Lease(manager, job_id, token, max_hold, ts=ts, safety_margin=safety_margin)


class Lease:
    """One job's hold on its lock, for a ``with`` or ``async with`` block.

    Once the lock is lost the manager tells the lease (its :meth:`tell`), and
    :attr:`lost`, :attr:`reason`, :meth:`check` and the waits say so.

    Args:
        manager: The manager, as :func:`actors.start_link` returned it.
        job_id: The job's id.
        token: The value the job's lock holds for this worker.
        max_hold: Most milliseconds to renew the lock for this lease (the
            manager's ``max_hold`` when ``None``); past it the lease is lost
            with the reason ``"max_hold"``.
        ts: When the lock was taken, in the manager's monotonic milliseconds
            (``time.monotonic_ns() // 1_000_000``); on entry when ``None``.
        safety_margin: Milliseconds (the manager's ``safety_margin`` when
            ``None``): the lock is trusted until ``lock_duration -
            safety_margin`` after its last confirmed renewal's send.

    Raises:
        TypeError: ``manager`` is not a manager's reference, or an argument
            has the wrong type.
        ValueError: ``job_id`` or ``token`` is empty, too long or not UTF-8,
            or ``max_hold`` or ``safety_margin`` is out of range.
    """

    def __init__(
        self,
        manager: ManagerRef,
        job_id: str,
        token: str,
        max_hold: int | None = None,
        *,
        ts: int | None = None,
        safety_margin: int | None = None,
    ) -> None:
        require_manager(manager)
        self._message = TrackJob(
            job_id, token, ts, self, max_hold, keep=True, safety_margin=safety_margin
        )
        #: How long the lock is trusted after a confirmed send, in ms (checks the margin).
        self._span = manager.trusted_for(self._message.safety_margin)
        self._manager = manager
        #: The lock's deadline as the manager keeps it, once it has answered the track.
        self._validity: Validity | None = None
        #: Until then, the deadline the lock earned by being taken.
        self._taken_deadline: int | None = None
        #: Whether the lease itself saw the deadline pass (the manager may not have yet).
        self._seen = False
        self._lock = threading.Lock()
        self._state = _NEW
        self._lost: LockLost | None = None
        # Set once nothing can change any more: the lock is lost, or the lease is left.
        self._done = threading.Event()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        # The answer to the TrackJob: until then a stopping manager may drop it silently.
        self._tracked: pykka.Future[Any] | None = None
        self._fence_lock = threading.Lock()
        self._fence: int | None = None

    @property
    def job_id(self) -> str:
        """The job's id."""
        return self._message.job_id

    @property
    def token(self) -> str:
        """The token of the lock this lease holds."""
        return self._message.token

    @property
    def max_hold(self) -> int | None:
        """The lease's own hold limit in milliseconds, or ``None``."""
        return self._message.max_hold

    @property
    def fence(self) -> int:
        """This holder's fencing number (see :func:`actors.fence`), taken on the first read.

        The first read costs one round trip on the manager's client and needs
        the lock to hold the lease's token; later reads return the same number,
        after a loss too: it still names this holder, whose writes a store that
        saw a later holder's number refuses. With the manager's ``replicas=``,
        the number is confirmed by the replicas as its renewals are.

        Raises:
            LockLost: The lock is lost, or no longer holds the lease's token
                (the lease is then lost too); no number was taken.
            LookupError: The job's hash is gone.
            RuntimeError: The lease is not held, or its manager renews through
                a renewer with no client.
            NotReplicatedError: Fewer replicas than the manager's ``replicas=``
                confirmed the number within its timeout (read it again to retry).
            redis.exceptions.RedisError: The server or the connection failed.
        """
        with self._fence_lock:
            if self._fence is None:
                if self._state is not _HELD:
                    raise RuntimeError(f"the lease of job {self.job_id!r} is not held")
                self.check()
                client, keys = self._manager.fencing()
                try:
                    self._fence = fence(
                        client, keys, self.job_id, self.token, replicas=self._manager.replicas
                    )
                except LockLost as lost:
                    self._lose(lost)
                    raise
            return self._fence

    @property
    def lost(self) -> bool:
        """Whether the lock was lost while the lease was held (for any reason)."""
        return self._current() is not None

    @property
    def deadline(self) -> int | None:
        """Until when the lock is certainly held, in the manager's monotonic ms, or ``None``.

        The last confirmed renewal's send (or the taking) plus ``lock_duration``
        minus the safety margin; ``None`` before the lease is entered.
        """
        if self._tracked is not None:
            self._settle(0)
        validity = self._validity
        return self._taken_deadline if validity is None else validity.deadline

    @property
    def reason(self) -> Reason | None:
        """Why the lock was lost, or ``None`` while it is not.

        ``"stolen"`` (another token), ``"expired"`` (the key is gone),
        ``"max_hold"``, ``"manager_stopped"`` or ``"unconfirmed"`` (no renewal
        confirmed by the deadline).
        """
        lost = self._current()
        return None if lost is None else lost.reason

    def check(self) -> None:
        """Raise :class:`~actors.LockLost` if the lock is lost; return otherwise.

        Call it between steps of the work: it costs no round trip.

        Raises:
            LockLost: The lock is lost; carries ``job_id``, ``token`` and ``reason``.
        """
        lost = self._current()
        if lost is not None:
            raise LockLost(lost.job_id, lost.token, lost.reason, lost.detail)

    def tell(self, message: Any) -> None:
        """Take a message from the manager: the :class:`~actors.LockLost` of this lock.

        Thread-safe and never blocks. The first loss is kept; a later one, a
        loss of another lock, or one after the lease was left is ignored.
        """
        if (
            isinstance(message, LockLost)
            and message.job_id == self.job_id
            and message.token == self.token
        ):
            self._lose(message)
        else:
            logger.warning(
                "lease of job %r ignored a %s",
                self.job_id,
                type(message).__name__,
                extra={"queue": self._manager.queue_name, "job_id": self.job_id},
            )

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the lock is lost or the lease is left, like ``threading.Event.wait``.

        For a watchdog thread beside the job; asyncio code awaits :meth:`wait_async`.

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
        # Woken by the manager, or at the deadline by this thread's own timeout.
        while self._current() is None and not self._done.is_set():
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                break
            self._done.wait(_shorter(left, self._until_deadline()))
        return self._current() is not None

    async def wait_async(self, timeout: float | None = None) -> bool:
        """:meth:`wait`, awaited: the event loop keeps running meanwhile."""
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

    async def _until_done(self) -> None:
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

    def _until_deadline(self) -> float | None:
        deadline = self.deadline
        now = None if deadline is None else self._now()
        if deadline is None or now is None:
            return None
        # At least a millisecond: the clock counts whole ones.
        return max(deadline - now, 1) / 1000

    def _finish(self) -> None:
        # Set under the lock: a task that registers after this finds it set.
        with self._lock:
            self._done.set()
            waiters = self._waiters.copy()
            self._waiters.clear()
        for loop, waiter in waiters:
            # A loop closed since has nobody left to wake.
            call_in_loop(loop, set_result, waiter, None)

    def __enter__(self: _L) -> _L:
        self._enter()
        # The answer carries the lock's true deadline; it comes at once, or the lock is lost.
        self._settle(self._until_deadline())
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._state is not _HELD:
            return  # never entered, or left already: nothing of this lease is tracked
        try:
            if self._current() is None or self._seen:
                # Waits for the manager: no tick runs on this lock for the lease after it returns.
                with contextlib.suppress(ManagerStopped):
                    self._manager.ask(self._untrack())
            self._settle(None)
        finally:
            self._close()

    async def __aenter__(self: _L) -> _L:
        self._enter()
        await self._settle_async(self._until_deadline())
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._state is not _HELD:
            return  # never entered, or left already: nothing of this lease is tracked
        try:
            if self._current() is None or self._seen:
                with contextlib.suppress(ManagerStopped):
                    await ask(self._manager, self._untrack())
            await self._settle_async()
        finally:
            self._close()

    def _untrack(self) -> UntrackJob:
        # Names the lease: its claim alone ends, whoever else holds the lock.
        return UntrackJob(self.job_id, self.token, self)

    def _enter(self) -> None:
        with self._lock:
            if self._state is not _NEW:
                raise RuntimeError(f"the lease of job {self.job_id!r} was already entered")
            self._state = _HELD
        try:
            message = self._message
            if message.ts is None:
                # Stamped here, so that the lease knows its deadline before the manager answers.
                message = dataclasses.replace(message, ts=self._manager.clock())
            assert message.ts is not None
            self._taken_deadline = message.ts + self._span
            # Asked: the answer says whether the manager took the claim (and its validity).
            self._tracked = self._manager.ask(message, block=False)
        except BaseException:
            # Nothing may outlive a failed entry; the lease can be entered again.
            with contextlib.suppress(Exception):
                self._manager.tell(self._untrack())
            with self._lock:
                self._state = _NEW
            raise

    def _require_entered(self) -> None:
        if self._state is _NEW:
            raise RuntimeError(f"the lease of job {self.job_id!r} was not entered")

    def _current(self) -> LockLost | None:
        """The loss, after looking at what the manager may not be able to say."""
        if self._lost is None and self._state is _HELD:
            if self._tracked is not None:
                self._settle(0)
            if self._lost is None and not self._manager.is_alive():
                # Stopped (or crashed): nobody renews the lock from now on.
                self._lose(LockLost(self.job_id, self.token, MANAGER_STOPPED))
            if self._lost is None:
                self._look_at_deadline()
        return self._lost

    def _now(self) -> int | None:
        try:
            return self._manager.clock()
        except Exception:
            # The clock is user code; the manager's own timer then judges the deadline.
            return None

    def _look_at_deadline(self) -> None:
        deadline = self.deadline
        if deadline is None:
            return
        now = self._now()
        if now is None or now < deadline:
            return
        validity = self._validity
        confirmed = deadline - self._span if validity is None else validity.confirmed
        span = self._span if validity is None else validity.span
        detail = "; ".join(
            filter(
                None,
                [
                    f"no renewal confirmed for {now - confirmed} ms (trusted for {span} ms "
                    f"after a confirmed send)",
                    self._manager.failures(),
                    f"seen by the job {now - deadline} ms after the deadline",
                ],
            )
        )
        if self._lose(LockLost(self.job_id, self.token, UNCONFIRMED, detail)):
            self._seen = True

    def _settle(self, timeout: float | None) -> None:
        """Read the manager's answer to the TrackJob, waiting up to ``timeout`` seconds."""
        tracked = self._tracked
        if tracked is None:
            return
        try:
            answer = tracked.get(timeout=timeout)
        except pykka.Timeout:
            return
        except pykka.ActorDeadError:
            self._lose(LockLost(self.job_id, self.token, MANAGER_STOPPED))
        else:
            if isinstance(answer, Validity):
                self._validity = answer
        self._tracked = None

    async def _settle_async(self, timeout: float | None = None) -> None:
        tracked = self._tracked
        if tracked is None:
            return
        with contextlib.suppress(pykka.ActorDeadError, pykka.Timeout):
            await answer(self._manager, tracked, timeout=timeout)
        self._settle(0)

    def _lose(self, lost: LockLost) -> bool:
        with self._lock:
            if self._lost is not None or self._state is not _HELD:
                return False
            self._lost = lost
        self._finish()
        return True

    def _close(self) -> None:
        with self._lock:
            self._state = _CLOSED
        self._finish()

    def __repr__(self) -> str:
        return (
            f"Lease({self.job_id!r}, state={self._state}, "
            f"reason={None if self._lost is None else self._lost.reason!r})"
        )


def _shorter(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    return a if b is None else min(a, b)


def _check_timeout(timeout: float | None) -> None:
    if timeout is not None and math.isnan(timeout):
        raise ValueError("timeout must be a number of seconds or None, got nan")
