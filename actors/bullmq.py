"""Stall-proof lock renewal for workers of the ``bullmq`` package (PyPI).

bullmq-py renews its jobs' locks from an asyncio task on the worker's event
loop. A processor that blocks that loop (``time.sleep``, a blocking client, a
CPU loop) blocks the renewal too: the lock expires, a stalled checker moves
the job back to wait, and it runs twice.

:func:`use_actor_lock_manager` swaps the worker's lock manager for an
:class:`ActorLockManager`, which has the same interface but renews through a
:class:`~actors.LockManager` on its own thread, with a synchronous client of
its own. A lost lock reaches the processor: its ``AbortSignal`` is aborted
with a reason starting with :data:`LOCK_LOST`, and the worker emits the
events bullmq-py emits (``lockRenewalFailed``, ``locksRenewed``, ``error``).

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

import asyncio
import contextlib
import contextvars
import functools
import inspect
import logging
import threading
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import pykka
import redis
import redis.asyncio

import actors
from actors import aio
from actors.connection import client_for_url, client_like, command_timeout
from actors.scripts import lock_holds

try:
    from bullmq.abort_controller import AbortController
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError(
        "actors.bullmq needs the bullmq package: pip install 'echomq-actors[bullmq]'"
    ) from error

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

__all__ = ["LOCK_LOST", "ActorLockManager", "use_actor_lock_manager"]

logger = logging.getLogger(__name__)

#: How the reason of an ``AbortSignal`` aborted for a lost lock begins.
LOCK_LOST = "lock lost"

#: ``stays_when`` of a call that never leaves the job active when it answers.
_NEVER = object()

#: Backend calls that move an active job away from active, deleting its lock,
#: and the answer that means the job stayed (see ActorLockManager.moving).
_MOVES: tuple[tuple[str, object], ...] = (
    ("moveToDelayed", _NEVER),
    ("moveToWaitingChildren", False),
)

#: The token of the run of a job that the current task is processing.
_RUN_TOKEN: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "actors_bullmq_run_token", default=None
)


@dataclass(frozen=True, slots=True)
class _Held:
    """One job the worker processes, as the worker's loop knows it."""

    #: The token its lock holds.
    token: str
    #: When it became active, in wall-clock milliseconds, as bullmq gives it.
    ts: int
    #: Aborts the signal the processor was given, if it asked for one.
    controller: AbortController | None
    #: The manager reported its lock lost.
    lost: bool = False
    #: The processor returned: the manager no longer renews the lock, which
    #: bullmq is about to release.
    released: bool = False


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _monotonic_from_wall(wall_ms: int) -> int:
    """Return the monotonic time, in ms, of a wall-clock instant in the recent past."""
    age = max(0, _now_ms() - wall_ms)
    return time.monotonic_ns() // 1_000_000 - age


class ActorLockManager:
    """bullmq-py's lock manager, renewing from a :class:`~actors.LockManager` thread.

    It has the interface the ``Worker`` uses (``start``, ``track_job``,
    ``untrack_job``, ``cancel_job``, ``cancel_all_jobs``, the counts and
    ``close``) and behaves the same, with three differences:

    - renewal runs on the manager's thread, so a processor that blocks the
      worker's loop keeps its lock;
    - a job whose lock was lost (stolen, or expired) has its ``AbortSignal``
      aborted with a reason starting with :data:`LOCK_LOST`, and is no longer
      renewed (bullmq-py would try it again every tick, and fail again);
    - when the processor returns, or moves its own job (to delayed, or to
      waiting-children), the job is untracked before bullmq deletes the lock,
      not after: a tick in between would find the lock gone and report a loss.
      (Installed by :func:`use_actor_lock_manager`, which wraps the worker's
      processor and those two calls of its backend.)

    Every method is called on the worker's event loop, as the ``Worker``
    does; the manager's reports reach the loop through
    ``loop.call_soon_threadsafe``, so listeners run there too, and a
    processor that blocks the loop sees its signal aborted once it awaits
    again: check ``signal.aborted`` after each blocking step.

    Args:
        worker: The bullmq ``Worker``; its ``emit`` delivers the events.
        lock_renew_time: Longest time between two renewals of a lock, in
            milliseconds (the worker's ``lockRenewTime``); ``0`` or less turns
            renewal off, as in bullmq-py.
        lock_duration: The TTL each renewal sets, in milliseconds (the
            worker's ``lockDuration``).
        worker_id: The worker's id, for diagnostics.
        worker_name: The worker's name, if it has one.
        connection: The client to renew with: a ``redis.Redis``, a
            ``redis.RedisCluster`` or a URL. When ``None``, a client with
            bounded timeouts is built from the worker's ``connection`` option.
        max_batch: Most ids per script call (see :func:`actors.start_link`).

    Raises:
        TypeError: A duration is not an ``int``, or the connection cannot be
            used (see :func:`use_actor_lock_manager`).
        ValueError: ``lock_renew_time`` is not below ``lock_duration``, or the
            queue's name or prefix cannot make keys.
    """

    def __init__(
        self,
        worker: Any,
        lock_renew_time: int,
        lock_duration: int,
        worker_id: str,
        worker_name: str | None = None,
        *,
        connection: redis.Redis | redis.RedisCluster | str | None = None,
        max_batch: int = actors.DEFAULT_MAX_BATCH,
    ) -> None:
        self.worker = worker
        self.lock_renew_time = lock_renew_time
        self.lock_duration = lock_duration
        self.worker_id = worker_id
        self.worker_name = worker_name
        self.closed = False
        self._keys = actors.QueueKeys(worker.name, prefix=worker.opts.get("prefix", "bull"))
        self._max_batch = max_batch
        self._jobs: dict[str, _Held] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._manager: actors.ManagerRef | None = None
        self._conn: redis.Redis | redis.RedisCluster | None = None
        self._owns_connection = False
        self._release_timeout = 0.0
        # bullmq-py turns renewal off for lockRenewTime <= 0; so does this.
        self._renews = not (
            isinstance(lock_renew_time, (int, float))
            and not isinstance(lock_renew_time, bool)
            and lock_renew_time <= 0
        )
        if not self._renews:
            return
        try:
            timing = actors.Timing(lock_duration, lock_renew_time)
        except (TypeError, ValueError) as error:
            raise type(error)(
                f"worker options lockDuration={lock_duration!r}, "
                f"lockRenewTime={lock_renew_time!r}: {error}"
            ) from error
        # Waiting for the manager to untrack a finished job holds the loop: at
        # most one attempt of a command, when a tick is in flight.
        self._release_timeout = command_timeout(timing.interval)
        if connection is None:
            options = worker.opts.get("connection", {})
            if isinstance(options, (redis.asyncio.RedisCluster, redis.RedisCluster)):
                raise TypeError(
                    "the worker talks to a Redis Cluster: pass the renewal client yourself, "
                    "use_actor_lock_manager(worker, connection=actors.connection."
                    f"cluster_client(url, interval_ms={timing.interval}))"
                )
            connection = client_like(options, interval_ms=timing.interval)
            self._owns_connection = True
        elif isinstance(connection, str):
            connection = client_for_url(connection, interval_ms=timing.interval)
            self._owns_connection = True
        elif not isinstance(connection, (redis.Redis, redis.RedisCluster)):
            raise TypeError(
                "connection must be a redis.Redis, a redis.RedisCluster or a URL, "
                f"got {type(connection).__name__}"
            )
        self._conn = connection

    # -- what the tests, examples and operators read ----------------------

    @property
    def renews(self) -> bool:
        """Whether renewal is on (``lock_renew_time > 0``, as in bullmq-py)."""
        return self._renews

    @property
    def keys(self) -> actors.QueueKeys:
        """The queue's keys: the worker's prefix and queue name."""
        return self._keys

    @property
    def connection(self) -> redis.Redis | redis.RedisCluster | None:
        """The synchronous client the manager renews with; ``None`` with renewal off."""
        return self._conn

    @property
    def manager(self) -> actors.ManagerRef | None:
        """The running :class:`~actors.LockManager`, for :func:`actors.get_stats`.

        ``None`` before :meth:`start`, after :meth:`close` and with renewal off.
        """
        return self._manager

    @property
    def tracked_jobs(self) -> dict[str, dict[str, Any]]:
        """A snapshot of the tracked jobs, shaped as bullmq-py's attribute.

        Each id maps to ``{"token", "ts", "abort_controller"}``. Changing the
        snapshot changes nothing: use :meth:`track_job` and :meth:`untrack_job`.
        """
        return {
            job_id: {"token": held.token, "ts": held.ts, "abort_controller": held.controller}
            for job_id, held in self._jobs.items()
        }

    # -- the interface the Worker uses ----------------------------------

    def start(self) -> None:
        """Start the manager's thread, on the worker's running loop. Idempotent.

        Raises:
            RuntimeError: No event loop is running in this thread.
        """
        if self.closed or self._manager is not None or self._conn is None:
            return
        self._loop = asyncio.get_running_loop()
        self._manager = actors.start_link(
            connection=self._conn,
            keys=self._keys,
            lock_duration=self.lock_duration,
            lock_renew_time=self.lock_renew_time,
            on_lock_renewal_failed=self._lost_from_thread,
            on_locks_renewed=self._renewed_from_thread,
            on_error=self._error_from_thread,
            max_batch=self._max_batch,
        )
        # Jobs tracked before the start are renewed from now on.
        for job_id, held in self._jobs.items():
            self._tell_track(job_id, held)

    def track_job(
        self,
        job_id: str,
        token: str,
        ts: int,
        should_create_controller: bool = False,
    ) -> AbortController | None:
        """Renew ``job_id``'s lock, held with ``token``, from now on.

        Args:
            job_id: The job's id.
            token: The token its lock holds.
            ts: When the job became active, in wall-clock milliseconds.
            should_create_controller: Create an ``AbortController`` for the
                processor's signal.

        Returns:
            The controller, or ``None`` when none was asked for, the job id is
            empty or the manager is closed.
        """
        if self.closed or not job_id:
            return None
        controller = AbortController() if should_create_controller else None
        held = _Held(token, ts, controller)
        self._jobs[str(job_id)] = held
        if self._manager is not None:
            self._tell_track(str(job_id), held)
        return controller

    def untrack_job(self, job_id: str) -> None:
        """Stop renewing ``job_id``'s lock: the job completed, failed or moved.

        bullmq calls it by id when a run of the job ends. When the job was
        taken again meanwhile (a stalled job handed back to this worker, with a
        new token), the old run's call leaves the new run's lock alone.
        """
        job_id = str(job_id)
        held = self._jobs.get(job_id)
        run = _RUN_TOKEN.get()
        if held is None or (run is not None and run != held.token):
            return
        del self._jobs[job_id]
        if not held.released and self._manager is not None:
            actors.untrack_job(self._manager, job_id, token=held.token)

    def cancel_job(self, job_id: str, reason: str | None = None) -> bool:
        """Abort ``job_id``'s signal with ``reason``.

        Returns:
            Whether the job is tracked and has a controller.
        """
        held = self._jobs.get(str(job_id))
        if held is None or held.controller is None:
            return False
        held.controller.abort(reason)
        return True

    def cancel_all_jobs(self, reason: str | None = None) -> None:
        """Abort the signal of every tracked job that has a controller."""
        for held in self._jobs.values():
            if held.controller is not None:
                held.controller.abort(reason)

    def get_active_job_count(self) -> int:
        """Return how many jobs are tracked."""
        return len(self._jobs)

    def get_tracked_job_ids(self) -> list[str]:
        """Return the tracked job ids."""
        return list(self._jobs)

    def is_running(self) -> bool:
        """Whether the manager renews: started, not closed, renewal on."""
        return not self.closed and self._manager is not None

    async def close(self) -> None:
        """Stop renewing and forget every job. Idempotent.

        The manager's thread (and a client built here) is stopped off the
        loop, by a short-lived thread that has ended when this returns.
        """
        if self.closed:
            return
        self.closed = True
        self._jobs.clear()
        manager, self._manager = self._manager, None
        conn = self._conn if self._owns_connection else None
        if manager is None and conn is None:
            return

        def release() -> BaseException | None:
            try:
                if manager is not None:
                    actors.stop(manager)
                if conn is not None:
                    conn.close()
            except Exception as error:
                return error
            return None

        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            # Closed outside any loop: a worker's run() finalized by the
            # garbage collector after its loop was closed. Stop here.
            failure = release()
        else:
            done: asyncio.Future[BaseException | None] = loop.create_future()

            def release_and_tell() -> None:
                failure = release()
                with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                    loop.call_soon_threadsafe(_settle, done, failure)

            # Stopping waits for a tick in flight; that wait must not hold the loop.
            thread = threading.Thread(
                target=release_and_tell, name=f"bullmq-locks-close-{self._keys.name}", daemon=True
            )
            thread.start()
            failure = await done
            thread.join()
        if failure is not None:
            self._emit("error", failure)

    def releasing(self, processor: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        """Wrap a bullmq processor so its job is untracked as soon as it returns.

        bullmq deletes a job's lock when it moves the job to completed or
        failed, right after the processor returns, and untracks the job only
        after that; a tick in between would find the lock gone and report it
        lost. The wrapper untracks first, and waits until the manager has (at
        most one command timeout, when a tick is in flight).

        Args:
            processor: The worker's processor, ``(job, token[, signal])``.

        Returns:
            A processor that takes and returns the same.
        """

        @functools.wraps(processor)
        async def process(job: Any, token: str, *signal: Any) -> Any:
            # Seen by untrack_job later in the same task: which run is ending.
            _RUN_TOKEN.set(token)
            try:
                return await processor(job, token, *signal)
            finally:
                await self._release(str(job.id), token)

        return process

    def moving(
        self, move: Callable[..., Awaitable[Any]], *, stays_when: object = _NEVER
    ) -> Callable[..., Awaitable[Any]]:
        """Wrap a backend call that moves an active job away, deleting its lock.

        A processor may move its own job (``job.moveToDelayed``,
        ``job.moveToWaitingChildren``), then raise bullmq's ``DelayedError`` or
        ``WaitingChildrenError``. The script deletes the lock; a tick before
        the processor returns would report it lost. The wrapper untracks the
        job first (as :meth:`releasing` does) and tracks it again, with its
        first timestamp, unless the job is known to have moved:

        - the call answered: the job moved, unless the answer is
          ``stays_when``;
        - the call raised (refused, timed out, connection lost, cancelled):
          the server may have run it all the same, so the lock is read back
          off the loop, and the job is tracked again if the lock still holds
          the run's token, or if it cannot be read;
        - the wait for the untrack was cancelled: the call never went out, and
          the job is tracked again.

        Args:
            move: The backend's method; it takes ``job_id`` and ``token``.
            stays_when: The answer that means the job is still active
                (``moveToWaitingChildren`` answers ``False`` when the job has
                no pending children).

        Returns:
            A method that takes and returns the same.
        """
        signature = inspect.signature(move)

        @functools.wraps(move)
        async def moved(*args: Any, **kwargs: Any) -> Any:
            given = signature.bind(*args, **kwargs)
            given.apply_defaults()
            job_id, token = str(given.arguments["job_id"]), str(given.arguments["token"])
            manager = self._mark_released(job_id, token)
            if manager is None:
                return await move(*args, **kwargs)
            # The job is now neither renewed nor reported. Whatever ends this
            # call, a cancel included, it must leave the job tracked again
            # unless it surely moved: an untracked active job's lock expires
            # under its processor, and nobody is told.
            gone = False
            try:
                await self._untracked(manager, job_id, token)
                try:
                    answer = await move(*args, **kwargs)
                except BaseException:
                    # No answer is no proof it stayed: a call cancelled or
                    # timed out after it was sent may have run on the server.
                    gone = not await self._lock_held(job_id, token)
                    raise
                gone = answer is not stays_when
                return answer
            finally:
                if not gone:
                    self._keep(job_id, token)

        return moved

    def _keep(self, job_id: str, token: str) -> None:
        # The job did not move: its lock is still the run's; renew it again.
        held = self._jobs.get(job_id)
        if self.closed or held is None or not held.released or held.token != token:
            return
        held = replace(held, released=False)
        self._jobs[job_id] = held
        if self._manager is not None:
            self._tell_track(job_id, held)

    async def _release(self, job_id: str, token: str) -> None:
        """Untrack the run's job, if tracked, and wait for the manager."""
        manager = self._mark_released(job_id, token)
        if manager is not None:
            await self._untracked(manager, job_id, token)

    def _mark_released(self, job_id: str, token: str) -> actors.ManagerRef | None:
        """Mark the run's job released; return the manager to untrack it from, if tracked."""
        held = self._jobs.get(job_id)
        manager = self._manager
        if held is None or held.released or held.token != token or manager is None:
            return None
        self._jobs[job_id] = replace(held, released=True)
        return manager

    async def _untracked(self, manager: actors.ManagerRef, job_id: str, token: str) -> None:
        """Untrack the job and wait for the manager, for at most one command timeout."""
        try:
            await aio.untrack_job(manager, job_id, token=token, timeout=self._release_timeout)
        except pykka.Timeout:
            # The untrack is still queued; a loss reported meanwhile is dropped.
            logger.debug("queue %r: job %r untracked without waiting", self._keys.name, job_id)

    async def _lock_held(self, job_id: str, token: str) -> bool:
        """Whether the job's lock still holds ``token``; ``True`` when it cannot be read.

        Read with the renewal client, whose timeouts are bounded, on a thread:
        the loop goes on meanwhile. An unreadable lock counts as held: renewing
        a lock that is gone costs one report, leaving a held one unrenewed
        loses the job.
        """
        conn = self._conn
        if conn is None:
            return True
        try:
            return await asyncio.to_thread(lock_holds, conn, self._keys, job_id, token)
        except Exception:
            logger.warning(
                "queue %r: could not read job %r's lock after its move failed; renewing it again",
                self._keys.name,
                job_id,
                exc_info=True,
            )
            return True

    # -- reports from the manager's thread -------------------------------

    def _tell_track(self, job_id: str, held: _Held) -> None:
        assert self._manager is not None
        # The manager counts from when the lock was taken, on its own clock.
        ts = _monotonic_from_wall(held.ts) if held.ts else None
        actors.track_job(self._manager, job_id, held.token, ts=ts)

    def _to_loop(self, callback: Callable[..., object], *args: object) -> None:
        # Runs on the manager's thread: hand over and return at once.
        loop = self._loop
        if loop is None or self.closed:
            return
        try:
            loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:
            logger.debug("worker loop of queue %r closed; report dropped", self._keys.name)

    def _lost_from_thread(self, job_ids: list[actors.LostLock]) -> None:
        lost = [(job_id.job_id, job_id.token, job_id.reason) for job_id in job_ids]
        self._to_loop(self._on_lost, lost)

    def _renewed_from_thread(self, job_ids: list[str]) -> None:
        self._to_loop(self._on_renewed, [str(job_id) for job_id in job_ids])

    def _error_from_thread(self, error: Exception) -> None:
        self._to_loop(self._emit, "error", error)

    # -- on the worker's loop ---------------------------------------------

    def _on_lost(self, lost: list[tuple[str, str, str]]) -> None:
        if self.closed:
            return
        reported = []
        for job_id, token, why in lost:
            held = self._jobs.get(job_id)
            # Gone or released: the worker finished the job and bullmq deletes
            # (deleted) its lock. Another token: the report is about an earlier
            # lock of a job taken again.
            if held is None or held.lost or held.released or token != held.token:
                continue
            self._jobs[job_id] = replace(held, lost=True)
            if held.controller is not None:
                held.controller.abort(f"{LOCK_LOST} ({why}): job {job_id}")
            reported.append(job_id)
        if reported:
            self._emit("lockRenewalFailed", reported)
            for job_id in reported:
                self._emit("error", Exception(f"could not renew lock for job {job_id}"))

    def _on_renewed(self, job_ids: list[str]) -> None:
        if not self.closed:
            self._emit("locksRenewed", {"count": len(job_ids), "jobIds": job_ids})

    def _emit(self, event: str, *args: object) -> None:
        # A listener that raises becomes an "error" event, as in bullmq-py.
        try:
            self.worker.emit(event, *args)
        except Exception as error:
            if event == "error":
                logger.warning(
                    "an 'error' listener of queue %r raised", self._keys.name, exc_info=True
                )
            else:
                self._emit("error", error)


def _settle(done: asyncio.Future[BaseException | None], failure: BaseException | None) -> None:
    if not done.done():
        done.set_result(failure)


def use_actor_lock_manager(
    worker: Any,
    *,
    connection: redis.Redis | redis.RedisCluster | str | None = None,
    max_batch: int = actors.DEFAULT_MAX_BATCH,
) -> ActorLockManager:
    """Make a bullmq ``Worker`` renew its locks from a thread; call before it runs.

    The worker's ``lockDuration``, ``lockRenewTime``, ``prefix`` and queue
    name carry over. Events and the processor's ``AbortSignal`` work as
    before; a lost lock now aborts the signal (see :class:`ActorLockManager`).
    The worker's processor is wrapped (:meth:`ActorLockManager.releasing`), and
    so are its backend's ``moveToDelayed`` and ``moveToWaitingChildren``
    (:meth:`ActorLockManager.moving`), so a job that finishes or moves itself
    is untracked before bullmq deletes its lock.

    Example:
        >>> worker = Worker("payments", process, {"connection": url, "autorun": False})
        >>> use_actor_lock_manager(worker)
        >>> await worker.run()

    Args:
        worker: A ``bullmq.Worker`` that has not started running. With
            ``autorun`` (bullmq's default), call this right after creating it,
            before the loop runs again.
        connection: The client to renew with; by default one is built from
            the worker's ``connection`` option (a URL, a dict of options or a
            ``redis.asyncio.Redis``), with timeouts that keep a failed tick
            short. A cluster needs one (``actors.connection.cluster_client``),
            and so does a Sentinel-managed client, whose settings do not name
            the server it reaches.
        max_batch: Most ids per script call.

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
        raise RuntimeError("install the lock manager before the worker runs")
    installed = ActorLockManager(
        worker,
        opts["lockRenewTime"],
        opts["lockDuration"],
        worker.id,
        worker.workerName,
        connection=connection,
        max_batch=max_batch,
    )
    worker.lockManager = installed
    if worker.processor is not None:
        worker.processor = installed.releasing(worker.processor)
    # The worker's jobs reach Redis through the worker's own backend.
    backend = getattr(worker, "backend", None)
    for name, stays_when in _MOVES:
        move = getattr(backend, name, None)
        if move is None:
            continue
        if not {"job_id", "token"} <= set(inspect.signature(move).parameters):
            logger.warning(
                "bullmq's %s takes no job_id and token: a job that moves itself that way "
                "may be reported lost once (tested bullmq: 3.4)",
                name,
            )
            continue
        setattr(backend, name, installed.moving(move, stays_when=stays_when))
    return installed
