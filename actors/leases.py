"""Leases: a job holds its lock for the length of a block, and learns when it is lost.

A lease tracks the job with its manager on entry, returning once the manager
has the claim (at once: the manager's thread waits for nothing), and
untracks it on exit, waiting until the manager has let it go (so no tick
can find the released lock gone and report it lost). The manager tells the lease,
once, if the lock is lost while the job runs; the job's code sees it at once,
however it prefers to look::

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

A leased lock is checked (and renewed) at every tick, not every other tick
as a plain tracked job's: a lock stolen or deleted behind the job's back is
found by the next tick, within one interval, and the job learns it in that
same tick. A job held past ``max_hold`` learns it at the first tick after its
hold limit, and a job whose manager stops learns it as the manager stops.

A lease also knows until when its lock is certainly held: ``lock_duration -
safety_margin`` after the last renewal the server confirmed was sent (for a
new lock, after it was taken). Past that deadline with no newer
confirmation (a partition, a paused server, a paused process) the lock is
lost with the reason ``"unconfirmed"``, before the server can have expired
it and let another worker take the job. :attr:`Lease.lost`,
:meth:`Lease.check` and the others compare the deadline themselves (one
clock read), so a job whose process was paused sees the loss at its first
look after the pause; :meth:`Lease.wait` and :meth:`Lease.wait_async` wake
at the deadline.

Leaving the block never raises for a lost lock: what to do about it (stop,
roll back, log) is the job's decision.

A lease is one claim on its lock among any others (the worker's own track, a
job actor's ``notify``, another lease): leaving ends the lease's claim alone,
and the lock is renewed while another claim remains. No other holder's
untrack ends it (an untrack without a ``notify`` leaves a lease's claim): a
lease ends only by its exit, the loss of its lock (a new token on it
included), its ``max_hold`` or the manager's stop, and the manager tells it
of each but its exit, so :meth:`Lease.wait` and :meth:`Lease.wait_async`
wake for every one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
import time
from typing import TYPE_CHECKING, Any, TypeVar

import pykka

from actors.aio import answer, ask, call_in_loop, set_result
from actors.jobs import Validity
from actors.messages import MANAGER_STOPPED, UNCONFIRMED, LockLost, TrackJob, UntrackJob
from actors.ref import ManagerRef, ManagerStopped, require_manager

if TYPE_CHECKING:
    from types import TracebackType

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
    """Hold ``job_id``'s lock for a ``with`` (or ``async with``) block.

    Entering adds the lease's claim on the lock (returning at once); leaving
    ends that claim alone and waits until the manager has let it go. Inside,
    the lease says whether the lock was lost and why (see :class:`Lease`).

    Example:
        >>> with lease(manager, "42", token) as held:
        ...     held.check()          # raises LockLost once the lock is lost

    Args:
        manager: The manager, as :func:`actors.start_link` returned it.
        job_id: The job's id.
        token: The value the job's lock holds for this worker.
        max_hold: Most milliseconds the manager keeps renewing this lock;
            the manager's own ``max_hold`` when ``None``.
        ts: When the lock was taken, in the manager's monotonic milliseconds
            (``time.monotonic_ns() // 1_000_000``); when entered if ``None``.
        safety_margin: This lease's margin in milliseconds; the manager's
            ``safety_margin`` when ``None`` (see :class:`Lease`).

    Returns:
        The lease, not yet entered.

    Raises:
        TypeError: ``manager`` is not a manager's reference, or an argument
            has the wrong type.
        ValueError: ``job_id`` or ``token`` is empty, too long or not UTF-8;
            ``max_hold`` is out of range; ``safety_margin`` does not fit the
            manager's windows.
    """
    return Lease(manager, job_id, token, max_hold, ts=ts, safety_margin=safety_margin)


class Lease:
    """One job's hold on its lock, for a ``with`` or ``async with`` block.

    Build it with :func:`lease`. While the block runs the manager renews the
    lock; if the lock is lost the manager tells the lease (through its
    :meth:`tell`, like any actor) and :attr:`lost`, :attr:`reason`,
    :meth:`check`, :meth:`wait` and :meth:`wait_async` all say so at once.

    Args:
        manager: The manager, as :func:`actors.start_link` returned it.
        job_id: The job's id.
        token: The value the job's lock holds for this worker.
        max_hold: Most milliseconds the manager keeps renewing this lock for
            the lease (the manager's own ``max_hold`` when ``None``); past it
            the lease is lost with the reason ``"max_hold"``. Another holder's
            claim on the same lock keeps its own terms.
        ts: When the lock was taken, in the manager's monotonic milliseconds;
            when the lease is entered if ``None``.
        safety_margin: This lease's margin in milliseconds (the manager's
            ``safety_margin`` when ``None``): the lock is trusted until
            ``lock_duration - safety_margin`` after its last confirmed
            renewal's send. A larger margin tells the job sooner, and gives
            up the lock sooner when Redis is only briefly out of reach.

    Raises:
        TypeError: ``manager`` is not a manager's reference, or an argument
            has the wrong type.
        ValueError: ``job_id`` or ``token`` is empty, too long or not UTF-8;
            ``max_hold`` is out of range; ``safety_margin`` is negative or
            not below the manager's ``lock_duration`` minus its interval.
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
        # The message checks every argument, here in the caller's thread.
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
        # The manager's answer to the TrackJob: until it comes, a manager that
        # stops may drop the message and never tell this lease anything.
        self._tracked: pykka.Future[Any] | None = None

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
    def lost(self) -> bool:
        """Whether the lock was lost while the lease was held (for any reason)."""
        return self._current() is not None

    @property
    def deadline(self) -> int | None:
        """Until when the lock is certainly held, in the manager's monotonic ms, or ``None``.

        The last confirmed renewal's send (or the lock's taking) plus
        ``lock_duration`` minus the safety margin; ``None`` before the lease
        is entered.
        """
        if self._tracked is not None:
            self._settle(0)
        validity = self._validity
        return self._taken_deadline if validity is None else validity.deadline

    @property
    def reason(self) -> Reason | None:
        """Why the lock was lost, or ``None`` while it is not.

        ``"stolen"`` (it holds another worker's token), ``"expired"`` (the key
        is gone), ``"max_hold"`` (held past ``max_hold``),
        ``"manager_stopped"`` (nobody renews it any more) or ``"unconfirmed"``
        (no renewal was confirmed by the deadline: the lock may have expired).
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

        Args:
            message: What the manager tells.
        """
        if (
            isinstance(message, LockLost)
            and message.job_id == self.job_id
            and message.token == self.token
        ):
            self._lose(message)
        else:
            logger.warning("lease of job %r ignored a %s", self.job_id, type(message).__name__)

    def wait(self, timeout: float | None = None) -> bool:
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

    async def wait_async(self, timeout: float | None = None) -> bool:
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
        """Seconds until the lock's deadline on the manager's clock, or ``None``."""
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

    # -- entering and leaving ---------------------------------------------

    def __enter__(self: _L) -> _L:
        self._enter()
        # The manager's answer carries the lock's true deadline: until it
        # comes the lease can only guess it from the taking. It comes at once
        # (the manager's thread waits for nothing), or the lock is lost.
        self._settle(self._until_deadline())
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
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

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
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
                # Stamped here, so that the lease knows the deadline its lock
                # earned by being taken before the manager answers.
                message = TrackJob(
                    message.job_id,
                    message.token,
                    self._manager.clock(),
                    self,
                    message.max_hold,
                    keep=True,
                    safety_margin=message.safety_margin,
                )
            assert message.ts is not None
            self._taken_deadline = message.ts + self._span
            # Asked rather than told: the answer says whether the manager took
            # the claim (with the lock's validity), or stopped before it could.
            self._tracked = self._manager.ask(message, block=False)
        except BaseException:
            # Nothing of the lease may outlive a failed entry: the claim, if
            # the message got in, ends; the lease can be entered again.
            with contextlib.suppress(Exception):
                self._manager.tell(self._untrack())
            with self._lock:
                self._state = _NEW
            raise

    def _require_entered(self) -> None:
        if self._state is _NEW:
            raise RuntimeError(f"the lease of job {self.job_id!r} was not entered")

    # -- state ---------------------------------------------------------------

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
            # The manager's clock is the user's code; the manager's own
            # timer then says whether the deadline passed.
            return None

    def _look_at_deadline(self) -> None:
        """Lose the lock with ``"unconfirmed"`` if its deadline has passed."""
        deadline = self.deadline
        if deadline is None:
            return
        now = self._now()
        if now is None or now < deadline:
            return
        validity = self._validity
        confirmed = deadline - self._span if validity is None else validity.confirmed
        span = self._span if validity is None else validity.span
        detail = (
            f"no renewal confirmed for {now - confirmed} ms (trusted for {span} ms after a "
            f"confirmed send); seen by the job {now - deadline} ms after the deadline"
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
        """Await the manager's answer to the TrackJob (up to ``timeout`` seconds), loop running."""
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
