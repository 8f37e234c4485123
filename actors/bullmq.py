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

import asyncio
import concurrent.futures
import contextvars
import functools
import inspect
import logging
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import msgpack
import pykka
import redis
import redis.asyncio

import actors
from actors.connection import client_for_url, client_like
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

#: ``stays_when`` of a move that never leaves the job active when it answers.
_NEVER = object()

#: The backend calls that move an active job away from active (deleting its
#: lock), and the answer that means the job stayed. Every way bullmq 3.4 ends
#: a run goes through one of them.
_MOVES: tuple[tuple[str, object], ...] = (
    ("moveToCompleted", _NEVER),
    ("moveToFailed", _NEVER),
    ("retryJob", _NEVER),
    ("moveToDelayed", _NEVER),
    ("moveToWaitingChildren", False),
)

#: Longest wait for the manager to stop when the worker closes, in seconds.
_STOP_S = 10.0

#: The script that takes a job and its lock.
_FETCH = "moveToActive"

#: The token of the run of a job that the current task is processing.
_RUN_TOKEN: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "actors_bullmq_run_token", default=None
)


@dataclass(frozen=True, slots=True)
class _Run:
    """One run of a job this worker holds, from its fetch to its move."""

    #: The token its lock holds.
    token: str
    #: When the lock was taken, in wall-clock milliseconds (bullmq's ``ts``).
    wall_ms: int
    #: Aborts the signal the processor was given, if it asked for one.
    controller: AbortController | None = None
    #: Why the manager reported the lock lost, if it did.
    lost: str | None = None
    #: A move of the job was sent and not yet answered.
    moving: bool = False


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


def _monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


def _monotonic_from_wall(wall_ms: int) -> int:
    """Return the monotonic time, in ms, of a wall-clock instant in the recent past."""
    return _monotonic_ms() - max(0, _wall_ms() - wall_ms)


class ActorLockManager:
    """bullmq-py's lock manager, renewing from a :class:`~actors.LockManager` thread.

    It has the interface the ``Worker`` uses (``start``, ``track_job``,
    ``untrack_job``, ``cancel_job``, ``cancel_all_jobs``, the counts and
    ``close``) and behaves the same, with these differences:

    - renewal runs on the manager's thread, so a processor that blocks the
      worker's loop keeps its lock, and so does every job fetched beside it;
    - a job is tracked from the moment its lock is taken (see
      :meth:`fetching`) until bullmq's move of it is answered (see
      :meth:`moving`), whatever the concurrency;
    - a job whose lock was lost (stolen, or expired) has its ``AbortSignal``
      aborted with a reason starting with :data:`LOCK_LOST`, and is no longer
      renewed (bullmq-py would try it again every tick, and fail again).

    Every method but :meth:`close` is called on the worker's event loop, as
    the ``Worker`` does; the manager's reports reach the loop through
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
        ValueError: ``lock_renew_time`` is not below ``lock_duration``.
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
        self._keys = actors.QueueKeys.as_bullmq_names(
            worker.name, prefix=worker.opts.get("prefix", "bull")
        )
        self._max_batch = max_batch
        self._jobs: dict[str, _Run] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._manager: actors.ManagerRef | None = None
        self._conn: redis.Redis | redis.RedisCluster | None = None
        self._owns_connection = False
        self._fetcher: _Fetcher | None = None
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
            job_id: {"token": run.token, "ts": run.wall_ms, "abort_controller": run.controller}
            for job_id, run in self._jobs.items()
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
        for job_id, run in self._jobs.items():
            self._tell_track(job_id, run.token, _monotonic_from_wall(run.wall_ms))

    def track_job(
        self,
        job_id: str,
        token: str,
        ts: int,
        should_create_controller: bool = False,
    ) -> AbortController | None:
        """Renew ``job_id``'s lock, held with ``token``, from now on.

        bullmq calls it when the job's processor task starts. A job the fetch
        already tracked keeps the time its lock was taken, and gets its
        controller; a controller made for a lock already lost starts aborted.

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
        job_id = str(job_id)
        # Seen by untrack_job later in the same task: which run is ending.
        _RUN_TOKEN.set(token)
        controller = AbortController() if should_create_controller else None
        run = self._jobs.get(job_id)
        if run is None or run.token != token:
            self._jobs[job_id] = _Run(token, ts, controller)
            if self._manager is not None:
                self._tell_track(job_id, token, _monotonic_from_wall(ts))
            return controller
        self._jobs[job_id] = replace(run, controller=controller)
        if controller is not None and run.lost is not None:
            controller.abort(self._abort_reason(job_id, run.lost))
        return controller

    def untrack_job(self, job_id: str) -> None:
        """Stop renewing ``job_id``'s lock: bullmq has moved the job, or gave it up.

        bullmq calls it by id when a run of the job ends, after its move was
        answered. When the job was taken again meanwhile (a job handed back to
        this worker, with a new token), the old run's call leaves the new
        run's lock alone.
        """
        job_id = str(job_id)
        run = self._jobs.get(job_id)
        ending = _RUN_TOKEN.get()
        if run is None or (ending is not None and ending != run.token):
            return
        del self._jobs[job_id]
        self._tell_untrack(job_id, run.token)

    def cancel_job(self, job_id: str, reason: str | None = None) -> bool:
        """Abort ``job_id``'s signal with ``reason``.

        Returns:
            Whether the job is tracked and has a controller.
        """
        run = self._jobs.get(str(job_id))
        if run is None or run.controller is None:
            return False
        run.controller.abort(reason)
        return True

    def cancel_all_jobs(self, reason: str | None = None) -> None:
        """Abort the signal of every tracked job that has a controller."""
        for run in self._jobs.values():
            if run.controller is not None:
                run.controller.abort(reason)

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

        The manager's thread, the fetch thread and the clients built here are
        stopped off the loop, on a thread that has ended when this returns:
        stopping waits for a tick in flight, which must not hold the loop.
        """
        if self.closed:
            return
        self.closed = True
        self._jobs.clear()
        manager, self._manager = self._manager, None
        fetcher, self._fetcher = self._fetcher, None
        conn = self._conn if self._owns_connection else None

        def release() -> None:
            if manager is not None:
                try:
                    actors.stop(manager, timeout=_STOP_S)
                except pykka.Timeout:
                    # The worker's close must end: say so, and leave the
                    # manager's daemon threads to the process.
                    raise TimeoutError(
                        f"the lock manager of queue {self._keys.name!r} did not stop within "
                        f"{_STOP_S:.0f} s"
                    ) from None
            if fetcher is not None:
                fetcher.close()
            if conn is not None:
                conn.close()

        try:
            asyncio.get_running_loop()
        except RuntimeError:
            # Closed outside any loop: a worker's run() finalized by the
            # garbage collector after its loop was closed. Stop here.
            failure = _attempt(release)
        else:
            # A thread of its own, ended when this returns.
            closer = concurrent.futures.ThreadPoolExecutor(1, f"bullmq-close-{self._keys.name}")
            try:
                failure = await asyncio.wrap_future(closer.submit(_attempt, release))
            finally:
                closer.shutdown(wait=True)
        if failure is not None:
            self._emit("error", failure)

    # -- the hooks into the worker's backend ------------------------------

    def fetching(self, script: Any) -> Callable[..., Awaitable[Any]] | None:
        """Wrap bullmq's ``moveToActive`` script so the lock it takes is tracked at once.

        The wrapper runs the same script, with the same keys and arguments,
        through a synchronous client of its own on a thread (the script is
        not retried: a second run would take a second job), and tracks the
        job on that thread as soon as the server answers, stamped with the
        moment the request was sent. The answer is handed back decoded as the
        worker's own client would have decoded it.

        Args:
            script: The worker's registered ``moveToActive`` script (a
                ``redis.asyncio`` ``AsyncScript``).

        Returns:
            An awaitable script with the same call signature, or ``None`` when
            the worker's client cannot be copied (the fetch then stays on the
            loop, and the job is tracked when its processor starts).
        """
        conn = getattr(getattr(self.worker, "backend", None), "conn", None)
        if not isinstance(conn, redis.asyncio.Redis) or not hasattr(script, "script"):
            return None
        try:
            self._fetcher = _Fetcher(self, script, conn)
        except TypeError:
            return None
        return self._fetcher.run

    def moving(
        self, move: Callable[..., Awaitable[Any]], *, stays_when: object = _NEVER
    ) -> Callable[..., Awaitable[Any]]:
        """Wrap a backend call that moves an active job away, deleting its lock.

        The job stays tracked while the move is under way, and a loss reported
        meanwhile is not reported on (the move deletes the lock; a tick may
        see it gone before the answer arrives). Then:

        - the move answered: the job moved, unless the answer is
          ``stays_when`` (``moveToWaitingChildren`` answers ``False`` when the
          job has no pending children); a job that moved is untracked;
        - the move raised (refused, timed out, connection lost, cancelled):
          the server may have run it all the same, so the lock is read back
          off the loop, and the job stays tracked if the lock still holds the
          run's token, or if it cannot be read.

        Args:
            move: The backend's method; it takes the job (``job``) or its id
                (``job_id``), and ``token``.
            stays_when: The answer that means the job is still active.

        Returns:
            A method that takes and returns the same.
        """
        signature = inspect.signature(move)

        @functools.wraps(move)
        async def moved(*args: Any, **kwargs: Any) -> Any:
            given = signature.bind(*args, **kwargs)
            job = given.arguments.get("job")
            job_id = str(given.arguments["job_id"] if job is None else job.id)
            token = str(given.arguments.get("token", "0"))
            run = self._jobs.get(job_id)
            if run is None or run.token != token or run.moving:
                return await move(*args, **kwargs)
            self._jobs[job_id] = replace(run, moving=True)
            stayed = False
            try:
                answer = await move(*args, **kwargs)
                stayed = answer is stays_when
                return answer
            except BaseException:
                # No answer is no proof either way: a call cancelled or timed
                # out after it was sent may have run on the server.
                stayed = await self._lock_held(job_id, token)
                raise
            finally:
                self._moved(job_id, token, stayed=stayed)

        return moved

    def _moved(self, job_id: str, token: str, *, stayed: bool) -> None:
        run = self._jobs.get(job_id)
        if run is None or run.token != token:
            return
        if stayed:
            self._jobs[job_id] = replace(run, moving=False)
            return
        del self._jobs[job_id]
        self._tell_untrack(job_id, token)

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

    # -- the manager, from any thread ----------------------------------

    def _tell_track(self, job_id: str, token: str, taken_ms: int) -> None:
        if self._manager is not None:
            actors.track_job(self._manager, job_id, token, ts=taken_ms)

    def _tell_untrack(self, job_id: str, token: str) -> None:
        if self._manager is not None:
            actors.untrack_job(self._manager, job_id, token=token)

    def _to_loop(self, callback: Callable[..., object], *args: object) -> None:
        # Runs on another thread: hand over and return at once.
        loop = self._loop
        if loop is None or self.closed:
            return
        try:
            loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:
            logger.debug("worker loop of queue %r closed; report dropped", self._keys.name)

    def _taken(self, job_id: str, token: str, sent_ms: int, sent_wall_ms: int) -> None:
        """Track a job the fetch took; runs on the fetch thread, when the server answers."""
        # The loop hears of the run before the manager can report on it:
        # call_soon_threadsafe keeps the order.
        self._to_loop(self._fetched, job_id, _Run(token, sent_wall_ms))
        self._tell_track(job_id, token, sent_ms)

    def _abandoned(self, job_id: str, token: str) -> None:
        """Untrack a job whose fetch was cancelled: no processor will run it."""
        self._tell_untrack(job_id, token)
        self._to_loop(self._forget, job_id, token)

    def _lost_from_thread(self, lost: list[actors.LostLock]) -> None:
        self._to_loop(self._on_lost, [(item.job_id, item.token, item.reason) for item in lost])

    def _renewed_from_thread(self, job_ids: list[str]) -> None:
        self._to_loop(self._on_renewed, [str(job_id) for job_id in job_ids])

    def _error_from_thread(self, error: Exception) -> None:
        self._to_loop(self._emit, "error", error)

    # -- on the worker's loop ---------------------------------------------

    def _fetched(self, job_id: str, run: _Run) -> None:
        current = self._jobs.get(job_id)
        if not self.closed and (current is None or current.token != run.token):
            self._jobs[job_id] = run

    def _forget(self, job_id: str, token: str) -> None:
        run = self._jobs.get(job_id)
        if run is not None and run.token == token:
            del self._jobs[job_id]

    def _abort_reason(self, job_id: str, why: str) -> str:
        return f"{LOCK_LOST} ({why}): job {job_id}"

    def _on_lost(self, lost: list[tuple[str, str, str]]) -> None:
        if self.closed:
            return
        reported = []
        for job_id, token, why in lost:
            run = self._jobs.get(job_id)
            # Gone or moving: bullmq moved the job (or is moving it), and the
            # move deleted its lock. Another token: the report is about an
            # earlier run of a job taken again.
            if run is None or run.lost is not None or run.moving or token != run.token:
                continue
            self._jobs[job_id] = replace(run, lost=why)
            if run.controller is not None:
                run.controller.abort(self._abort_reason(job_id, why))
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


class _Fetcher:
    """bullmq's ``moveToActive`` script, run on a thread that tracks the job it takes."""

    def __init__(self, owner: ActorLockManager, script: Any, conn: Any) -> None:
        self._owner = owner
        # Sent once and never retried: a second run would take a second job.
        # An answer later than the lock's duration finds the lock expired.
        self._client = client_like(
            conn, interval_ms=owner.lock_duration, timeout=owner.lock_duration / 1000, retries=0
        )
        self._script = self._client.register_script(script.script)
        self._decode = conn.get_encoder().decode
        self._prefix = owner.keys.key_prefix
        # One thread: the worker's own client sends one command at a time too.
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"bullmq-fetch-{owner.keys.name}"
        )

    async def run(self, keys: Any = None, args: Any = None, client: Any = None) -> Any:
        """Run the script as the worker's own client would, from the worker's loop."""
        fetch = self._executor.submit(self._fetch, list(keys or ()), list(args or ()))
        try:
            answer, _ = await asyncio.wrap_future(fetch)
        except asyncio.CancelledError:
            # Nobody will process what it takes: let its lock expire.
            fetch.add_done_callback(self._abandon)
            raise
        return answer

    def _fetch(self, keys: list[Any], args: list[Any]) -> tuple[Any, tuple[str, str] | None]:
        sent_ms, sent_wall_ms = _monotonic_ms(), _wall_ms()
        answer = _decoded(self._script(keys=keys, args=args), self._decode)
        taken = self._job_taken(args, answer)
        if taken is not None:
            self._owner._taken(*taken, sent_ms, sent_wall_ms)
        return answer, taken

    def _job_taken(self, args: list[Any], answer: Any) -> tuple[str, str] | None:
        """The job id and token the answer took a lock for, if any.

        ``ARGV[1]`` is the queue's key prefix, ``ARGV[3]`` the packed options
        holding the token: the script's argument layout, shared by every
        BullMQ runtime. The answer's second entry is the job's id.
        """
        if not isinstance(answer, list) or len(answer) < 2 or not answer[1]:
            return None
        if len(args) < 3 or str(args[0]) != self._prefix:
            return None
        try:
            token = msgpack.unpackb(args[2]).get("token")
        except Exception:
            return None
        if not isinstance(token, str) or not token:
            return None
        return str(answer[1]), token

    def _abandon(
        self, fetch: concurrent.futures.Future[tuple[Any, tuple[str, str] | None]]
    ) -> None:
        if fetch.cancelled() or fetch.exception() is not None:
            return
        _, taken = fetch.result()
        if taken is not None:
            self._owner._abandoned(*taken)

    def close(self) -> None:
        """End the fetch thread, then close the client."""
        self._executor.shutdown(wait=True, cancel_futures=True)
        self._client.close()


def _decoded(reply: Any, decode: Callable[[Any], Any]) -> Any:
    """Decode a reply as a client with the worker's decoding settings would have."""
    if isinstance(reply, list):
        return [_decoded(item, decode) for item in reply]
    return decode(reply)


def _attempt(action: Callable[[], None]) -> BaseException | None:
    try:
        action()
    except Exception as error:
        return error
    return None


def use_actor_lock_manager(
    worker: Any,
    *,
    connection: redis.Redis | redis.RedisCluster | str | None = None,
    max_batch: int = actors.DEFAULT_MAX_BATCH,
) -> ActorLockManager:
    """Make a bullmq ``Worker`` renew its locks from a thread; call before it runs.

    The worker's ``lockDuration``, ``lockRenewTime``, ``prefix``, queue name
    and ``concurrency`` carry over. Events and the processor's
    ``AbortSignal`` work as before; a lost lock now aborts the signal (see
    :class:`ActorLockManager`). The worker's fetch script and its backend's
    moves are wrapped (:meth:`ActorLockManager.fetching`,
    :meth:`ActorLockManager.moving`), so each job is renewed from the moment
    its lock is taken until bullmq has moved it.

    Example:
        >>> worker = Worker("payments", process, {"connection": url, "autorun": False})
        >>> use_actor_lock_manager(worker)
        >>> await worker.run()

    Args:
        worker: A ``bullmq.Worker`` that has not started running: create it
            with ``"autorun": False``, install, then ``await worker.run()``.
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
    )
    worker.lockManager = installed
    if installed.renews:
        _hook_backend(worker, installed)
    return installed


def _hook_backend(worker: Any, installed: ActorLockManager) -> None:
    """Wrap the worker's fetch script and its backend's moves, on this worker only."""
    backend: Any = worker.backend
    scripts: Any = getattr(backend, "scripts", None)
    commands: Any = getattr(scripts, "commands", None)
    fetch = None
    if isinstance(commands, dict) and _FETCH in commands:
        fetch = installed.fetching(commands[_FETCH])
    if fetch is None:
        logger.warning(
            "queue %r: bullmq's fetch cannot run off the loop here; a job fetched beside a "
            "processor that blocks the loop is tracked only when its processor starts",
            worker.name,
        )
    else:
        # A copy: the dict belongs to the connection, which other queues may share.
        scripts.commands = {**commands, _FETCH: fetch}
    for name, stays_when in _MOVES:
        move = getattr(backend, name, None)
        parameters = set(inspect.signature(move).parameters) if callable(move) else set()
        if move is None or "token" not in parameters or not parameters & {"job", "job_id"}:
            logger.warning(
                "bullmq's %s takes no job and token: a job it moves may be reported lost once "
                "(tested bullmq: 3.4)",
                name,
            )
            continue
        setattr(backend, name, installed.moving(move, stays_when=stays_when))
