"""The module helpers: one function per operation, and ``start_link`` and ``stop``.

Each builds the operation's message, checked in the caller's thread, and
sends it to the manager; the queries wait for the answer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from actors.lock_manager import LockManager
from actors.messages import (
    GetActiveJobCount,
    GetStats,
    GetTrackedJobIds,
    IsTracked,
    TrackJob,
    UntrackJob,
)
from actors.ref import ManagerRef, ManagerStopped, require_manager
from actors.scripts import DEFAULT_MAX_BATCH
from actors.timing import DEFAULT_LOCK_DURATION

if TYPE_CHECKING:
    from collections.abc import Callable

    from actors.connection import Client
    from actors.messages import LostLock, Notify, Renewer
    from actors.report import Stats
    from actors.scripts import Replicas
    from actors.timer import TimerFactory

__all__ = [
    "get_active_job_count",
    "get_stats",
    "get_tracked_job_ids",
    "is_tracked",
    "start_link",
    "stop",
    "track_job",
    "untrack_job",
]


def start_link(
    *,
    connection: Client | str | None = None,
    keys: Any,
    lock_duration: int = DEFAULT_LOCK_DURATION,
    lock_renew_time: int | None = None,
    on_lock_renewal_failed: Callable[[list[LostLock]], object] | None = None,
    on_locks_renewed: Callable[[list[str]], object] | None = None,
    on_error: Callable[[Exception], object] | None = None,
    max_batch: int = DEFAULT_MAX_BATCH,
    max_hold: int | None = None,
    renewer: Renewer | None = None,
    clock: Callable[[], int] | None = None,
    timer: TimerFactory | None = None,
    safety_margin: int | None = None,
    isolation: str = "thread",
    replicas: int | Replicas | None = None,
) -> ManagerRef:
    """Start a :class:`~actors.LockManager` and return its reference.

    Example:
        >>> manager = start_link(connection=redis.Redis(socket_timeout=1),
        ...                      keys=QueueKeys("myqueue"))
        >>> track_job(manager, "42", token)

    Args:
        connection: A ``redis.Redis`` or ``redis.RedisCluster`` client, or a
            Redis URL (the manager then builds and closes a client bounded by
            :func:`actors.connection.command_timeout`).
        keys: The queue's keys.
        lock_duration: The lock TTL set at each renewal, in milliseconds.
        lock_renew_time: Most milliseconds between two renewals of a lock;
            ``lock_duration // 2`` when ``None``.
        on_lock_renewal_failed: Called with the lost jobs, untracked first, as
            :class:`~actors.LostLock` ids carrying ``token`` and ``reason``.
        on_locks_renewed: Called with the ids renewed by a tick.
        on_error: Called with the exception of a tick whose Redis call failed.
        max_batch: Most ids per script call; a tick's calls share one round trip.
        max_hold: Most milliseconds any job's lock is renewed (``None``: no
            cap); past it the job is reported ``"max_hold"``.
        renewer: What renews the locks instead of the script on ``connection``.
        clock: The monotonic clock, in milliseconds, for stamps and ticks.
        timer: Builds the manager's one timer (see :mod:`actors.timer`).
        safety_margin: Milliseconds: a watched lock is trusted until
            ``lock_duration - safety_margin`` after the last confirmed
            renewal's send, then its watchers are told ``"unconfirmed"``.
            Half the interval when ``None``; below ``lock_duration`` minus the interval.
        isolation: ``"thread"`` (the default), or ``"process"``: the timer and
            renewals run in a child process (see
            :class:`~actors.process.ProcessLockManager`), so no GIL hold
            delays a renewal and the locks are deleted when the worker dies;
            ``connection`` must then be a URL or a ``redis.Redis``, and
            ``renewer``, ``clock`` and ``timer`` are refused.
        replicas: Replicas that must confirm each renewal, as a count or an
            :class:`~actors.Replicas` (with its timeout, or ``aof=True`` for
            ``WAITAOF``): a watched lock's deadline moves only on renewals
            they confirmed, so its watchers are told ``"unconfirmed"`` before a
            replica's older copy of the lock can expire. ``None`` or ``0``:
            the primary's word is enough. Not with ``renewer``, nor with a
            Redis Cluster client. The server is asked once, here, whether it
            takes the wait (a round trip, bounded by the wait per attempt).

    Callbacks run one at a time on the manager's delivery thread, and the
    targets' ``tell`` at once on threads of their own, never the manager's,
    so either may query, untrack and wait, or stop the manager; a slow
    callback delays the later callbacks, never a renewal nor a target.
    Whatever they raise is logged and changes nothing.

    Raises:
        TypeError: An argument has the wrong type.
        ValueError: A duration, ``isolation`` or ``replicas`` is out of range
            (a replicas timeout may take half a renewal's wait per attempt),
            the client's encoding is not UTF-8, a cluster's keys cannot share
            a slot, or the server refuses the replicas' wait (``WAITAOF``
            before Redis 7.2, an ACL without ``WAIT``).
        RuntimeError: With ``isolation="process"``, the child process did not start.
    """
    ref = LockManager.start(
        connection=connection,
        keys=keys,
        lock_duration=lock_duration,
        lock_renew_time=lock_renew_time,
        on_lock_renewal_failed=on_lock_renewal_failed,
        on_locks_renewed=on_locks_renewed,
        on_error=on_error,
        max_batch=max_batch,
        max_hold=max_hold,
        renewer=renewer,
        clock=clock,
        timer=timer,
        safety_margin=safety_margin,
        isolation=isolation,
        replicas=replicas,
    )
    assert isinstance(ref, ManagerRef)
    return ref


def _send(manager: ManagerRef, message: Any) -> None:
    try:
        manager.tell(message)
    except ManagerStopped:
        manager._ignored(message.operation)


def _ask(manager: ManagerRef, message: Any, *, timeout: float | None) -> Any:
    return require_manager(manager).ask(message, timeout=timeout)


def track_job(
    manager: ManagerRef,
    job_id: str,
    token: str,
    *,
    ts: int | None = None,
    notify: Notify | None = None,
    max_hold: int | None = None,
    wait: bool = False,
    timeout: float | None = None,
) -> None:
    """Tell ``manager`` to renew ``job_id``'s lock, held with ``token``.

    Returns at once by default. With ``wait=True`` it returns once the
    renewing side has the lock: the manager's books in thread mode, and in
    process mode the child's socket, so that a call right after that holds the
    GIL (C code that never lets it go) finds its lock renewed throughout. Each
    call adds a claim, named by its ``notify`` target (see
    :class:`~actors.TrackJob`). A stopped manager ignores it, warning once.

    Args:
        manager: The manager.
        job_id: The job's id.
        token: The value the lock holds for this worker.
        ts: When the lock was taken, in the manager's monotonic milliseconds
            (``time.monotonic_ns() // 1_000_000``); now when ``None``.
        notify: Anything with ``tell``, told a :class:`~actors.LockLost` once
            if the lock is lost.
        max_hold: Most milliseconds to renew this lock; the manager's
            ``max_hold`` when ``None``.
        wait: Wait until the renewing side has the lock.
        timeout: With ``wait``, the most seconds to wait.

    Raises:
        TypeError: An argument has the wrong type.
        ValueError: ``job_id`` or ``token`` is empty, too long or not UTF-8;
            ``max_hold`` is out of range.
        pykka.Timeout: With ``wait``, no answer within ``timeout`` seconds
            (the claim may still be taken).
    """
    ref = require_manager(manager)
    # Stamped in the caller's thread, however long the message then waits.
    stamp = ref.clock() if ts is None else ts
    message = TrackJob(job_id, token, stamp, notify, max_hold)
    if not wait:
        _send(ref, message)
        return
    try:
        _ask(ref, message, timeout=timeout)
    except ManagerStopped:
        ref._ignored(message.operation)


def untrack_job(
    manager: ManagerRef,
    job_id: str,
    *,
    token: str | None = None,
    notify: Notify | None = None,
    wait: bool = False,
    timeout: float | None = None,
) -> None:
    """Tell ``manager`` to stop renewing ``job_id``'s lock.

    Returns at once by default. Before deleting the lock itself, a worker
    should pass ``wait=True``: the call then returns once the manager has
    untracked the job, so no queued tick can report the lock lost. The
    manager's thread never waits for Redis, so this is safe from anywhere, a
    callback included; a stopped manager returns at once.

    It ends the plain and every ``notify`` target's claim (with ``notify``,
    that one's alone); leases' claims end only with their lease.

    Args:
        manager: The manager.
        job_id: The job's id.
        token: Untrack only the lock holding this token (a newer lock of the
            job stays tracked); whatever token it holds when ``None``.
        notify: End only the claim this target made (compared by identity).
        wait: Wait until the manager has untracked the job.
        timeout: With ``wait``, the most seconds to wait.

    Raises:
        TypeError: ``job_id`` is not a ``str``, or ``notify`` has no ``tell``.
        ValueError: ``job_id`` is empty, too long or not UTF-8.
        pykka.Timeout: With ``wait``, no answer within ``timeout`` seconds.
    """
    manager = require_manager(manager)
    message = UntrackJob(job_id, token, notify)
    if not wait:
        _send(manager, message)
        return
    try:
        _ask(manager, message, timeout=timeout)
    except ManagerStopped:
        manager._ignored(message.operation)


def get_active_job_count(manager: ManagerRef, *, timeout: float | None = None) -> int:
    """Ask ``manager`` how many jobs it tracks.

    Raises:
        ManagerStopped: The manager is stopped.
        pykka.Timeout: No answer within ``timeout`` seconds.
    """
    return cast("int", _ask(manager, GetActiveJobCount(), timeout=timeout))


def get_tracked_job_ids(manager: ManagerRef, *, timeout: float | None = None) -> list[str]:
    """Ask ``manager`` for the ids it tracks.

    Raises:
        ManagerStopped: The manager is stopped.
        pykka.Timeout: No answer within ``timeout`` seconds.
    """
    return cast("list[str]", _ask(manager, GetTrackedJobIds(), timeout=timeout))


def is_tracked(manager: ManagerRef, job_id: str, *, timeout: float | None = None) -> bool:
    """Ask ``manager`` whether it tracks ``job_id``.

    Raises:
        TypeError: ``job_id`` is not a ``str``.
        ValueError: ``job_id`` is empty, too long or not UTF-8.
        ManagerStopped: The manager is stopped.
        pykka.Timeout: No answer within ``timeout`` seconds.
    """
    return cast("bool", _ask(manager, IsTracked(job_id), timeout=timeout))


def get_stats(manager: ManagerRef, *, timeout: float | None = None) -> Stats:
    """Ask ``manager`` for its counters.

    Raises:
        ManagerStopped: The manager is stopped.
        pykka.Timeout: No answer within ``timeout`` seconds.
    """
    return cast("Stats", _ask(manager, GetStats(), timeout=timeout))


def stop(manager: ManagerRef, *, timeout: float | None = None) -> bool:
    """Stop ``manager``: no tick, no Redis command and no thread is left after.

    Idempotent and thread-safe. It returns once the manager's threads have
    ended and its last reports were delivered; from a callback it does not
    wait for the delivery thread, so managers stopping each other never wait.

    Returns:
        ``True`` for the one call that stopped the manager, ``False`` for any other.

    Raises:
        pykka.Timeout: Not stopped within ``timeout`` seconds.
    """
    return cast("bool", require_manager(manager).stop(block=True, timeout=timeout))
