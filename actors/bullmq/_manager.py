"""The lock manager a bullmq ``Worker`` calls, renewing through a manager's thread."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import logging
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import pykka
import redis
import redis.asyncio
from bullmq.abort_controller import AbortController

from actors._loop import call_in_loop
from actors.api import start_link, stop, track_job, untrack_job
from actors.connection import client_for_url, client_like
from actors.evalsha import DEFAULT_MAX_BATCH
from actors.keys import QueueKeys
from actors.lost import LockLost
from actors.readback import lock_holds
from actors.schedule import Timing, monotonic_ms

if TYPE_CHECKING:
    from collections.abc import Callable

    from actors.bullmq._hooks import Fetcher
    from actors.lost import LostLock
    from actors.ref import ManagerRef

__all__ = ["LOCK_LOST", "ActorLockManager"]

logger = logging.getLogger("actors.bullmq")

#: How the reason of an ``AbortSignal`` aborted for a lost lock begins.
LOCK_LOST = "lock lost"

#: Longest wait for the manager to stop when the worker closes, in seconds.
_STOP_S = 10.0

#: Why a run is lost when the same worker takes its job again with a new token.
_TAKEN_AGAIN = "taken again"

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
    #: The task processing it (bullmq's ``processJob``), once it has started.
    task: asyncio.Task[Any] | None = None


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


def _monotonic_from_wall(wall_ms: int) -> int:
    """Return the monotonic time, in ms, of a wall-clock instant in the recent past."""
    return monotonic_ms() - max(0, _wall_ms() - wall_ms)


class ActorLockManager:
    """bullmq-py's lock manager, renewing from a :class:`~actors.LockManager` thread.

    It has the interface the ``Worker`` uses (``start``, ``track_job``,
    ``untrack_job``, ``cancel_job``, ``cancel_all_jobs``, the counts and
    ``close``) and behaves the same, with these differences:

    - renewal runs on the manager's thread, so a processor that blocks the
      worker's loop keeps its lock, and so does every job fetched beside it;
    - a job is tracked from the moment its lock is taken (bullmq's fetch runs
      on a thread of its own) until bullmq's move of it is answered, whatever
      the concurrency (installed by :func:`~actors.bullmq.use_actor_lock_manager`);
    - a job whose lock was lost (stolen, expired, or taken again by this
      worker) has its ``AbortSignal`` aborted with a reason starting with
      :data:`LOCK_LOST`, and is no longer renewed;
    - a graceful close goes on renewing every job the worker still
      processes, a job fetched while it closes included, until bullmq has
      moved it.

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
            used (see :func:`~actors.bullmq.use_actor_lock_manager`).
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
        max_batch: int = DEFAULT_MAX_BATCH,
    ) -> None:
        self.worker = worker
        self.lock_renew_time = lock_renew_time
        self.lock_duration = lock_duration
        self.worker_id = worker_id
        self.worker_name = worker_name
        self.closed = False
        #: Set once a close began: the fetch takes no more jobs.
        self.closing = False
        self._keys = QueueKeys.as_bullmq_names(
            worker.name, prefix=worker.opts.get("prefix", "bull")
        )
        self._max_batch = max_batch
        self._jobs: dict[str, _Run] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._manager: ManagerRef | None = None
        self._conn: redis.Redis | redis.RedisCluster | None = None
        self._owns_connection = False
        self.fetcher: Fetcher | None = None
        self._reader: concurrent.futures.ThreadPoolExecutor | None = None
        self._shutdown: asyncio.Future[None] | None = None
        self._changed: asyncio.Event | None = None
        # bullmq-py turns renewal off for lockRenewTime <= 0; so does this.
        self._renews = not (
            isinstance(lock_renew_time, (int, float))
            and not isinstance(lock_renew_time, bool)
            and lock_renew_time <= 0
        )
        if not self._renews:
            return
        try:
            timing = Timing(lock_duration, lock_renew_time)
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
    def keys(self) -> QueueKeys:
        """The queue's keys: the worker's prefix and queue name."""
        return self._keys

    @property
    def connection(self) -> redis.Redis | redis.RedisCluster | None:
        """The synchronous client the manager renews with; ``None`` with renewal off."""
        return self._conn

    @property
    def manager(self) -> ManagerRef | None:
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
        if self.closing or self._manager is not None or self._conn is None:
            return
        self._loop = asyncio.get_running_loop()
        self._manager = start_link(
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
        task = _current_task()
        if task is not None:
            task.add_done_callback(self._poke)
        run = self._jobs.get(job_id)
        if run is None or run.token != token:
            self._replace(job_id, _Run(token, ts, controller, task=task))
            self._tell_track(job_id, token, _monotonic_from_wall(ts))
        else:
            self._jobs[job_id] = replace(run, controller=controller, task=task)
            if controller is not None and run.lost is not None:
                controller.abort(_abort_reason(job_id, run.lost))
        self._poke()
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
        if run is not None and (ending is None or ending == run.token):
            self.release(job_id, run.token)

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
        """Stop renewing and forget every job, once bullmq has moved them. Idempotent.

        A graceful close goes on renewing every job the worker still
        processes (one whose fetch was answered while closing included) until
        its move is answered; a forced one (``worker.close(force=True)``)
        stops at once. The manager's thread, the fetch thread and the clients
        built here are then stopped off the loop, on a thread that has ended
        when this returns. Every call, the worker's and its ``run()``'s, waits
        for that one shutdown.
        """
        self.closing = True
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            # Closed outside any loop: a worker's run() finalized by the
            # garbage collector after its loop was closed. Stop here.
            self._finish(_attempt(self._release_all()))
            return
        if self._shutdown is None:
            self._shutdown = asyncio.ensure_future(self._shut_down())
        self._poke()
        await asyncio.shield(self._shutdown)

    # -- closing ----------------------------------------------------------

    async def _shut_down(self) -> None:
        while self._must_wait():
            if self._changed is None:
                self._changed = asyncio.Event()
            self._changed.clear()
            await self._changed.wait()
        release = self._release_all()
        closer = concurrent.futures.ThreadPoolExecutor(1, f"bullmq-close-{self._keys.name}")
        try:
            failure = await asyncio.wrap_future(closer.submit(_attempt, release))
        finally:
            closer.shutdown(wait=True)
        self._finish(failure)

    def _must_wait(self) -> bool:
        """Whether a graceful close must go on renewing: a run is still to be moved."""
        if self._manager is None or getattr(self.worker, "forceClosing", False):
            return False
        running = bool(getattr(self.worker, "running", False))
        # The worker's own processing tasks: a run tracked by other code (a
        # test, a tool) is not the worker's to finish.
        processing = getattr(self.worker, "processing", ())
        for run in self._jobs.values():
            if run.task is not None and not run.task.done() and run.task in processing:
                return True
            # Fetched, not yet processed: run() processes it while it runs.
            if run.task is None and running:
                return True
        return False

    def _poke(self, *_: object) -> None:
        if self._changed is not None:
            self._changed.set()

    def _release_all(self) -> Callable[[], None]:
        """Forget every job; return what stops the threads and clients, to run off the loop."""
        self.closed = True
        self._jobs.clear()
        manager, self._manager = self._manager, None
        fetcher, self.fetcher = self.fetcher, None
        reader, self._reader = self._reader, None
        conn = self._conn if self._owns_connection else None
        name = self._keys.name

        def release() -> None:
            if fetcher is not None:
                fetcher.close()
            if reader is not None:
                reader.shutdown(wait=True)
            if manager is not None:
                try:
                    stop(manager, timeout=_STOP_S)
                except pykka.Timeout:
                    # The worker's close must end: say so, and leave the
                    # manager's daemon threads to the process.
                    raise TimeoutError(
                        f"the lock manager of queue {name!r} did not stop within {_STOP_S:.0f} s"
                    ) from None
            if conn is not None:
                conn.close()

        return release

    def _finish(self, failure: BaseException | None) -> None:
        if failure is not None:
            self._emit("error", failure)

    # -- runs: taken, moving, moved ----------------------------------------

    def taken(self, job_id: str, token: str, sent_ms: int, sent_wall_ms: int) -> None:
        """Track a job the fetch took; runs on the fetch thread, when the server answers."""
        # The loop hears of the run before the manager can report on it:
        # calls handed to the loop keep their order.
        self._to_loop(self._fetched, job_id, _Run(token, sent_wall_ms))
        self._tell_track(job_id, token, sent_ms)

    def abandoned(self, job_id: str, token: str) -> None:
        """Untrack a job whose fetch nobody awaits any more: no processor will run it."""
        self._tell_untrack(job_id, token)
        self._to_loop(self.release, job_id, token)

    def moving(self, job_id: str, token: str) -> bool:
        """Mark the run holding ``token`` as being moved; return whether one was."""
        run = self._jobs.get(job_id)
        if run is None or run.token != token or run.moving:
            return False
        self._jobs[job_id] = replace(run, moving=True)
        return True

    def moved(self, job_id: str, token: str, *, stayed: bool) -> None:
        """The move of the run holding ``token`` ended: the job left, or ``stayed`` active."""
        run = self._jobs.get(job_id)
        if run is None or run.token != token:
            return
        if stayed:
            self._jobs[job_id] = replace(run, moving=False)
        else:
            self.release(job_id, token)

    def release(self, job_id: str, token: str) -> None:
        """Untrack the run holding ``token``, if it is still the job's run."""
        run = self._jobs.get(job_id)
        if run is not None and run.token == token:
            del self._jobs[job_id]
            self._tell_untrack(job_id, token)
            self._poke()

    def release_unstarted(self, job_id: str, token: str) -> None:
        """Untrack the run of ``job_id`` fetched with ``token`` if its processor never started.

        bullmq gave up on the job between its fetch and its processor (an
        ``active`` listener raised, the job's data could not be read): its
        lock is left to expire, and a stalled check hands it on.
        """
        run = self._jobs.get(job_id)
        if run is not None and run.token == token and run.task is None:
            self.release(job_id, token)

    async def lock_held(self, job_id: str, token: str) -> bool:
        """Whether the job's lock still holds ``token``; ``True`` when it cannot be read.

        Read with the renewal client, whose timeouts are bounded, on a thread
        of this manager's: the loop goes on meanwhile. An unreadable lock
        counts as held: renewing a lock that is gone costs one report, leaving
        a held one unrenewed loses the job.
        """
        conn = self._conn
        if conn is None or self.closed:
            return True
        if self._reader is None:
            self._reader = concurrent.futures.ThreadPoolExecutor(
                1, f"bullmq-read-{self._keys.name}"
            )
        try:
            read = self._reader.submit(lock_holds, conn, self._keys, job_id, token)
            return await asyncio.wrap_future(read)
        except Exception:
            logger.warning(
                "queue %r: could not read job %r's lock after its move failed; renewing it again",
                self._keys.name,
                job_id,
                exc_info=True,
            )
            return True

    def _replace(self, job_id: str, run: _Run) -> None:
        """Make ``run`` the job's run; a live run it replaces has lost its lock."""
        old = self._jobs.get(job_id)
        self._jobs[job_id] = run
        if old is not None and old.token != run.token and not old.moving and old.lost is None:
            # The job was handed back and this worker took it again: the
            # old run's lock is gone, and its processor must hear so.
            self._report_lost([(job_id, old, _TAKEN_AGAIN)])

    # -- the manager, from any thread ----------------------------------

    def _tell_track(self, job_id: str, token: str, taken_ms: int) -> None:
        # Watched, by this object (see tell): trusted only until its deadline.
        if self._manager is not None:
            track_job(self._manager, job_id, token, ts=taken_ms, notify=self)

    def _tell_untrack(self, job_id: str, token: str) -> None:
        if self._manager is not None:
            untrack_job(self._manager, job_id, token=token, notify=self)

    def tell(self, message: object) -> None:
        """Hear of a lost lock from the manager, as every job's ``notify`` target.

        Told on the manager's thread (its timer's, at a watched lock's
        deadline): handed to the worker's loop, which aborts the run's signal.
        """
        if isinstance(message, LockLost):
            self._to_loop(self._on_lost, [(message.job_id, message.token, message.reason)])

    def _to_loop(self, callback: Callable[..., object], *args: object) -> None:
        # Runs on another thread: hand over and return at once.
        loop = self._loop
        if loop is not None and not self.closed and not call_in_loop(loop, callback, *args):
            logger.debug("worker loop of queue %r closed; report dropped", self._keys.name)

    def _lost_from_thread(self, lost: list[LostLock]) -> None:
        self._to_loop(self._on_lost, [(item.job_id, item.token, item.reason) for item in lost])

    def _renewed_from_thread(self, job_ids: list[str]) -> None:
        self._to_loop(self._on_renewed, [str(job_id) for job_id in job_ids])

    def _error_from_thread(self, error: Exception) -> None:
        self._to_loop(self._emit, "error", error)

    # -- on the worker's loop ---------------------------------------------

    def _fetched(self, job_id: str, run: _Run) -> None:
        current = self._jobs.get(job_id)
        if not self.closed and (current is None or current.token != run.token):
            self._replace(job_id, run)
            self._poke()

    def _on_lost(self, lost: list[tuple[str, str, str]]) -> None:
        if self.closed:
            return
        reported = []
        for job_id, token, why in lost:
            run = self._jobs.get(job_id)
            # Gone or moving: bullmq moved the job (or is moving it), and the
            # move deleted its lock. Another token: the report is about an
            # earlier run of a job taken again, told when it was replaced.
            if run is None or run.lost is not None or run.moving or token != run.token:
                continue
            self._jobs[job_id] = replace(run, lost=why)
            reported.append((job_id, run, why))
        self._report_lost(reported)

    def _report_lost(self, lost: list[tuple[str, _Run, str]]) -> None:
        """Abort each run's signal, then emit the events bullmq-py emits, once per report."""
        for job_id, run, why in lost:
            if run.controller is not None:
                run.controller.abort(_abort_reason(job_id, why))
        if lost:
            self._emit("lockRenewalFailed", [job_id for job_id, _, _ in lost])
            for job_id, _, _ in lost:
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


def _abort_reason(job_id: str, why: str) -> str:
    return f"{LOCK_LOST} ({why}): job {job_id}"


def _current_task() -> asyncio.Task[Any] | None:
    try:
        return asyncio.current_task()
    except RuntimeError:
        return None


def _attempt(action: Callable[[], None]) -> BaseException | None:
    try:
        action()
    except Exception as error:
        return error
    return None
