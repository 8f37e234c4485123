"""Leases: a job holds its lock for the length of a block, and learns when it is lost.

A lease tracks the job with its manager on entry and untracks it on exit,
waiting until the manager has let it go (so no tick already queued can find
the released lock gone and report it lost). The manager tells the lease,
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
deadline, and a job whose manager stops learns it as the manager stops.

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

from typing import TYPE_CHECKING

from actors.lease_hold import Lease

if TYPE_CHECKING:
    from actors.ref import ManagerRef

__all__ = ["Lease", "lease"]


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
