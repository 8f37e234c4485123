"""Stall-proof lock renewal for workers of the ``bullmq`` package (PyPI), at any concurrency.

bullmq-py renews its jobs' locks from an asyncio task on the worker's event
loop, and starts renewing a job only once its processor's task first runs. A
processor that blocks that loop (``time.sleep``, a blocking client, a CPU
loop) stops the renewal of every job of the worker, and keeps the jobs
fetched beside it from ever being tracked: their locks expire, a stalled
checker moves them back to wait, and they run twice.

:func:`use_actor_lock_manager` swaps the worker's lock manager for an
:class:`ActorLockManager`, which renews through a :class:`~actors.LockManager`
on its own thread, and covers each job from the fetch that takes its lock to
the move that releases it:

- **taken**: bullmq's fetch (the ``moveToActive`` script) runs on a thread,
  with a client of its own, and the job is tracked there as soon as the
  server answers, stamped with the moment the request was sent: a blocked
  loop can delay neither the answer nor the tracking;
- **moved**: the job stays tracked until the server has answered bullmq's
  move of it (completed, failed, retried, delayed, waiting-children). A loss
  reported while a move is under way is the move's doing, not a loss of the
  run, and is not reported.

A lost lock reaches the processor: its ``AbortSignal`` is aborted with a
reason starting with :data:`LOCK_LOST`, and the worker emits the events
bullmq-py emits (``lockRenewalFailed``, ``locksRenewed``, ``error``).

Example:
    >>> worker = Worker("payments", process, {"connection": url, "autorun": False})
    >>> use_actor_lock_manager(worker)
    >>> await worker.run()

A thread helps as long as the blocking code lets go of the GIL: blocking I/O
and ``time.sleep`` do, and pure-Python loops are preempted every
``sys.getswitchinterval()`` (5 ms). C code that holds the GIL (a catastrophic
regular expression, some native extensions) starves every thread of the
process; run such work in another process.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

try:
    import bullmq.abort_controller  # noqa: F401
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError("actors.bullmq needs the bullmq package: pip install '.[bullmq]'") from error

from actors.bullmq.hooks import hook_worker
from actors.bullmq.manager import LOCK_LOST, ActorLockManager
from actors.scripts import DEFAULT_MAX_BATCH

if TYPE_CHECKING:
    import redis

__all__ = ["LOCK_LOST", "ActorLockManager", "use_actor_lock_manager"]


def use_actor_lock_manager(
    worker: Any,
    *,
    connection: redis.Redis | redis.RedisCluster | str | None = None,
    max_batch: int = DEFAULT_MAX_BATCH,
    isolation: str = "thread",
) -> ActorLockManager:
    """Make a bullmq ``Worker`` renew its locks from a thread; call before it runs.

    The worker's ``lockDuration``, ``lockRenewTime``, ``prefix``, queue name
    and ``concurrency`` carry over. Events and the processor's
    ``AbortSignal`` work as before; a lost lock now aborts the signal (see
    :class:`ActorLockManager`). The worker's fetch, its ``getNextJob`` and
    its backend's moves are wrapped, so each job is renewed from the moment
    its lock is taken until bullmq has moved it.

    Example:
        >>> worker = Worker("payments", process, {"connection": url, "autorun": False})
        >>> use_actor_lock_manager(worker)
        >>> await worker.run()

    Args:
        worker: A ``bullmq.Worker`` that has not started running: create it
            with ``"autorun": False``, install, then ``await worker.run()``
            (with bullmq's default ``autorun``, install right after creating
            it, before the loop runs again).
        connection: The client to renew with; by default one is built from
            the worker's ``connection`` option (a URL, a dict of options or a
            ``redis.asyncio.Redis``), with timeouts that keep a failed tick
            short. A cluster needs one (``actors.connection.cluster_client``),
            and so does a Sentinel-managed client, whose settings do not name
            the server it reaches.
        max_batch: Most ids per script call.
        isolation: ``"thread"`` (the default) or ``"process"``: the renewals
            then run in a child process, so a processor that holds the GIL
            keeps its locks, and a killed worker's locks go at once (see
            :func:`actors.start_link`).

    Returns:
        The installed manager (also ``worker.lockManager``); installing twice
        returns the first.

    Raises:
        TypeError: ``worker`` is not a bullmq ``Worker`` on Redis, or the
            connection cannot be used.
        RuntimeError: The worker is running or closed.
        ValueError: The worker's durations cannot make a schedule.
    """
    current = getattr(worker, "lockManager", None)
    opts = getattr(worker, "opts", None)
    if current is None or not isinstance(opts, dict) or not isinstance(worker.name, str):
        raise TypeError(f"worker must be a bullmq Worker, got {type(worker).__name__}")
    if isinstance(current, ActorLockManager):
        return current
    if opts.get("backend", "redis") != "redis":
        raise TypeError(f"only a Redis backend can be renewed, not {opts['backend']!r}")
    if worker.running or worker.closing or worker.closed or current.is_running():
        raise RuntimeError(
            "install the lock manager before the worker runs: create the Worker with "
            '{"autorun": False}, call use_actor_lock_manager(worker), then await worker.run()'
        )
    installed = ActorLockManager(
        worker,
        opts["lockRenewTime"],
        opts["lockDuration"],
        worker.id,
        worker.workerName,
        connection=connection,
        max_batch=max_batch,
        isolation=isolation,
    )
    worker.lockManager = installed
    if installed.renews:
        hook_worker(worker, installed)
    return installed
