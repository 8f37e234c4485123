"""The module helpers: one function per operation, and ``start_link`` and ``stop``.

Each builds the operation's message (which checks its arguments in the
caller's thread) and sends it to the manager; the queries wait for the answer.
From a manager's own thread (one of its callbacks) a query answers at once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

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
    from actors.messages import LostLock, Notify
    from actors.renewer import Renewer
    from actors.report import Stats
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
) -> ManagerRef:
    """Start a :class:`~actors.LockManager` and return its reference.

    Example:
        >>> manager = start_link(connection=redis.Redis(socket_timeout=1),
        ...                      keys=QueueKeys("myqueue"))
        >>> track_job(manager, "42", token)

    Args:
        connection: A ``redis.Redis`` or ``redis.RedisCluster`` client, or a
            Redis URL (the manager then builds a client whose attempts end
            within :func:`actors.connection.command_timeout`, and closes it
            when it stops).
        keys: The queue's keys.
        lock_duration: The lock TTL set at each renewal, in milliseconds.
        lock_renew_time: Longest time between two renewals of a lock, in
            milliseconds; ``lock_duration // 2`` when ``None``.
        on_lock_renewal_failed: Called with the lost jobs, untracked first:
            a list of :class:`~actors.LostLock`, each a ``str`` (the id) that
            also carries the lost ``token`` and the ``reason``.
        on_locks_renewed: Called with the ids renewed by a tick.
        on_error: Called with the exception of a tick whose Redis call failed.
        max_batch: Most ids per script call; a tick's calls share one round trip.
        max_hold: Most milliseconds any job's lock is renewed (``None``: no
            cap); past it the job is untracked and reported ``"max_hold"``.
        renewer: What renews the locks, instead of the shared script on
            ``connection`` (another backend, or a test's lock table).
        clock: The monotonic clock, in milliseconds, for stamps and ticks.
        timer: Builds the manager's one timer (see :mod:`actors.timer`).
        safety_margin: How long before the server could expire a watched
            lock (a lease's, a ``notify`` target's) its watchers are told
            ``"unconfirmed"``, in milliseconds: the lock is trusted until
            ``lock_duration - safety_margin`` after the last renewal the
            server confirmed was sent. Half the timer interval when ``None``
            (see ``actors.timing.default_safety_margin``); it must be
            below ``lock_duration`` minus the interval.
        isolation: ``"thread"`` (the default): the timer and the renewals run
            on this manager's threads. ``"process"``: they run in a child
            process the manager starts and ends (see :class:`~actors.process.ProcessLockManager`),
            so no GIL hold in the worker delays a renewal, and the locks are
            deleted (compare-and-delete on the token) when the worker dies.
            The same API, messages, callbacks and leases; ``connection`` must
            then be a URL or a ``redis.Redis`` (no cluster yet), and
            ``renewer``, ``clock`` and ``timer`` are refused.

    Callbacks and the targets' ``tell`` run on the manager's delivery thread,
    one at a time, in the order the manager decided, after the step that
    decided them is done: never on the manager's own thread, so a callback
    may query the manager, untrack and wait, or stop it. A slow callback
    delays the ones after it, never a renewal. Whatever they raise
    (``SystemExit`` included) is logged and changes nothing.

    Raises:
        TypeError: An argument has the wrong type.
        ValueError: A duration is out of range, the client's encoding is not
            UTF-8, or a cluster client was given for keys that cannot share
            one hash slot; ``isolation`` is not ``"thread"`` or ``"process"``.
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
) -> None:
    """Tell ``manager`` to renew ``job_id``'s lock, held with ``token``.

    Returns at once. Each call adds a claim on the lock, named by its
    ``notify`` target (none: the plain claim), with its own ``max_hold``; the
    same claim again changes nothing. With a new token it is a fresh lock. A
    lock lost recently is not tracked again with the same token (a new
    ``notify`` target is told of the loss at once). A stopped manager ignores
    it (with a warning, once).

    Args:
        manager: The manager.
        job_id: The job's id.
        token: The value the lock holds for this worker.
        ts: When the lock was taken, in the manager's monotonic milliseconds
            (``time.monotonic_ns() // 1_000_000``); now when ``None``.
        notify: An actor (anything with ``tell``) told a
            :class:`~actors.LockLost` once if the lock is lost, as is every
            other target the lock was tracked with.
        max_hold: Most milliseconds to renew this lock; the manager's
            ``max_hold`` when ``None``.

    Raises:
        TypeError: An argument has the wrong type.
        ValueError: ``job_id`` or ``token`` is empty, too long or not UTF-8;
            ``max_hold`` is out of range.
    """
    ref = require_manager(manager)
    # Stamped here, in the caller's thread: the job's clock starts now,
    # however long the message then waits in the mailbox.
    stamp = ref.clock() if ts is None else ts
    _send(ref, TrackJob(job_id, token, stamp, notify, max_hold))


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
    untracked the job, so no tick already queued can find the lock gone and
    report it lost. A stopped manager tracks nothing: it returns at once.

    A lock may have several claims (the worker's plain track, each
    ``notify`` target's, each lease's): this untrack ends the plain claim and
    every ``notify`` target's claim on the lock (on ``token``, or on whatever
    token the job holds now when ``None``), and leaves the leases' claims,
    which end only with their lease; the lock is renewed while a claim
    remains. With ``notify``, it ends that target's claim alone.

    With ``wait`` the caller waits for the manager's thread, which runs no
    user code and never waits for Redis: from anywhere, a callback included,
    the answer comes as soon as the messages before it are handled. A
    renewal on its way meanwhile changes nothing: its answer about a lock
    untracked since is dropped.

    Args:
        manager: The manager.
        job_id: The job's id.
        token: Untrack only the lock holding this token: a newer lock of the
            same job (tracked since with another token) stays tracked.
        notify: End only the claim this target made with ``track_job``
            (compared by identity).
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
    count: int = _ask(manager, GetActiveJobCount(), timeout=timeout)
    return count


def get_tracked_job_ids(manager: ManagerRef, *, timeout: float | None = None) -> list[str]:
    """Ask ``manager`` for the ids it tracks.

    Raises:
        ManagerStopped: The manager is stopped.
        pykka.Timeout: No answer within ``timeout`` seconds.
    """
    ids: list[str] = _ask(manager, GetTrackedJobIds(), timeout=timeout)
    return ids


def is_tracked(manager: ManagerRef, job_id: str, *, timeout: float | None = None) -> bool:
    """Ask ``manager`` whether it tracks ``job_id``.

    Raises:
        TypeError: ``job_id`` is not a ``str``.
        ValueError: ``job_id`` is empty, too long or not UTF-8.
        ManagerStopped: The manager is stopped.
        pykka.Timeout: No answer within ``timeout`` seconds.
    """
    tracked: bool = _ask(manager, IsTracked(job_id), timeout=timeout)
    return tracked


def get_stats(manager: ManagerRef, *, timeout: float | None = None) -> Stats:
    """Ask ``manager`` for its counters.

    Raises:
        ManagerStopped: The manager is stopped.
        pykka.Timeout: No answer within ``timeout`` seconds.
    """
    stats: Stats = _ask(manager, GetStats(), timeout=timeout)
    return stats


def stop(manager: ManagerRef, *, timeout: float | None = None) -> bool:
    """Stop ``manager``: no tick, no Redis command and no thread is left after.

    Idempotent and safe from several threads at once: a stopped or dead
    manager is fine. It returns once the manager's threads have ended and
    its last reports (each watcher's ``"manager_stopped"``) were delivered;
    called from a callback of any manager, it waits for the manager's own
    thread but not for its delivery thread, so two managers whose callbacks
    stop each other (``pykka.ActorRegistry.stop_all()``, say) never wait for
    one another.

    Returns:
        ``True`` for exactly one call, the one that stopped the manager;
        ``False`` for every other, however the calls race.

    Raises:
        pykka.Timeout: Not stopped within ``timeout`` seconds.
    """
    stopped: bool = require_manager(manager).stop(block=True, timeout=timeout)
    return stopped
