"""Stall-proof lock renewal for workers of the ``bullmq`` package (PyPI), at any concurrency.

bullmq-py renews locks from a task on the worker's event loop: a processor
that blocks the loop stops the renewal of every job of the worker, and the
jobs run twice. :func:`use_actor_lock_manager` swaps in an
:class:`ActorLockManager`, which renews from a :class:`~actors.LockManager`'s
thread, from the fetch that takes each lock until bullmq's move of the job is
answered. A lost lock aborts the processor's ``AbortSignal`` with a reason
starting with :data:`LOCK_LOST`. Code that holds the GIL (some C extensions)
needs ``isolation="process"``.
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

    from actors.scripts import Replicas

__all__ = ["LOCK_LOST", "ActorLockManager", "use_actor_lock_manager"]


def use_actor_lock_manager(
    worker: Any,
    *,
    connection: redis.Redis | redis.RedisCluster | str | None = None,
    max_batch: int = DEFAULT_MAX_BATCH,
    isolation: str = "thread",
    replicas: int | Replicas | None = None,
) -> ActorLockManager:
    """Make a bullmq ``Worker`` renew its locks from a thread; call before it runs.

    The worker's ``lockDuration``, ``lockRenewTime``, ``prefix``, queue name
    and ``concurrency`` carry over; its fetch, ``getNextJob`` and backend
    moves are wrapped, so each job is renewed from the taking of its lock
    until bullmq has moved it. Each fetch of bullmq's run loop takes its job
    with a token of its own (bullmq-py 3.4 gives the fetches of one pass of
    its loop one token: a repeat gets a suffix, ``{worker.id}:{n}:{k}``), and
    a run's ``signal.aborted`` reads its lock's deadline itself.

    Example:
        >>> worker = Worker("payments", process, {"connection": url, "autorun": False})
        >>> use_actor_lock_manager(worker)
        >>> await worker.run()

    Args:
        worker: A ``bullmq.Worker`` not yet running: create it with
            ``"autorun": False`` (or install before the loop runs again).
        connection: The client to renew with; by default one with bounded
            timeouts is built from the worker's ``connection`` option (a
            cluster or Sentinel-managed client must be passed).
        max_batch: Most ids per script call.
        isolation: ``"thread"`` or ``"process"`` (see :func:`actors.start_link`).
        replicas: Replicas that must confirm each renewal before a job's
            deadline moves (see :func:`actors.start_link`).

    Returns:
        The installed manager (also ``worker.lockManager``), the first if installed twice.

    Raises:
        TypeError: ``worker`` is not a bullmq ``Worker`` on Redis, or the
            connection cannot be used.
        RuntimeError: The worker is running or closed.
        ValueError: The worker's durations cannot make a schedule, or
            ``replicas`` is out of range or waits longer than a renewal may.
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
        replicas=replicas,
    )
    worker.lockManager = installed
    if installed.renews:
        hook_worker(worker, installed)
    return installed
