"""The lock manager a bullmq ``Worker`` calls, renewing through a manager's thread."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from bullmq.abort_controller import AbortController

from actors.bullmq._client import renewal_client
from actors.bullmq._close import attempt, must_wait, off_the_loop, stopper
from actors.bullmq._renewal import Renewal
from actors.bullmq._runs import LOCK_LOST, RUN_TOKEN, Runs, monotonic_from_wall
from actors.evalsha import DEFAULT_MAX_BATCH
from actors.keys import QueueKeys

if TYPE_CHECKING:
    from collections.abc import Callable

    import redis

    from actors.bullmq._hooks import Fetcher
    from actors.ref import ManagerRef

__all__ = ["LOCK_LOST", "ActorLockManager"]


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
        self._runs = Runs(worker, self._keys.name, self._untrack, self._poke)
        self._renewal: Renewal | None = None
        self.fetcher: Fetcher | None = None
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
        conn, owned = renewal_client(worker, connection, lock_duration, lock_renew_time)
        self._renewal = Renewal(self, self._runs, conn, owned, max_batch)

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
        return None if self._renewal is None else self._renewal.connection

    @property
    def manager(self) -> ManagerRef | None:
        """The running :class:`~actors.LockManager`, for :func:`actors.get_stats`.

        ``None`` before :meth:`start`, after :meth:`close` and with renewal off.
        """
        return None if self._renewal is None else self._renewal.manager

    @property
    def tracked_jobs(self) -> dict[str, dict[str, Any]]:
        """A snapshot of the tracked jobs, shaped as bullmq-py's attribute.

        Each id maps to ``{"token", "ts", "abort_controller"}``. Changing the
        snapshot changes nothing: use :meth:`track_job` and :meth:`untrack_job`.
        """
        return self._runs.snapshot()

    # -- the interface the Worker uses ----------------------------------

    def start(self) -> None:
        """Start the manager's thread, on the worker's running loop. Idempotent.

        Raises:
            RuntimeError: No event loop is running in this thread.
        """
        if self.closing or self._renewal is None or self._renewal.manager is not None:
            return
        self._renewal.start()

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
        RUN_TOKEN.set(token)
        controller = AbortController() if should_create_controller else None
        task = _current_task()
        if task is not None:
            task.add_done_callback(self._poke)
        if self._runs.started(job_id, token, ts, controller, task) and self._renewal is not None:
            self._renewal.track(job_id, token, monotonic_from_wall(ts))
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
        run = self._runs.get(job_id)
        ending = RUN_TOKEN.get()
        if run is not None and (ending is None or ending == run.token):
            self._runs.release(job_id, run.token)

    def cancel_job(self, job_id: str, reason: str | None = None) -> bool:
        """Abort ``job_id``'s signal with ``reason``.

        Returns:
            Whether the job is tracked and has a controller.
        """
        run = self._runs.get(str(job_id))
        if run is None or run.controller is None:
            return False
        run.controller.abort(reason)
        return True

    def cancel_all_jobs(self, reason: str | None = None) -> None:
        """Abort the signal of every tracked job that has a controller."""
        for _, run in self._runs.items():
            if run.controller is not None:
                run.controller.abort(reason)

    def get_active_job_count(self) -> int:
        """Return how many jobs are tracked."""
        return len(self._runs)

    def get_tracked_job_ids(self) -> list[str]:
        """Return the tracked job ids."""
        return self._runs.ids()

    def is_running(self) -> bool:
        """Whether the manager renews: started, not closed, renewal on."""
        return not self.closed and self.manager is not None

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
            self._finish(attempt(self._release_all()))
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
        self._finish(await off_the_loop(self._keys.name, self._release_all()))

    def _must_wait(self) -> bool:
        """Whether a graceful close must go on renewing: a run is still to be moved."""
        runs = (run for _, run in self._runs.items())
        return self.manager is not None and must_wait(self.worker, runs)

    def _poke(self, *_: object) -> None:
        if self._changed is not None:
            self._changed.set()

    def _release_all(self) -> Callable[[], None]:
        """Forget every job; return what stops the threads and clients, to run off the loop."""
        self.closed = True
        self._runs.clear()
        fetcher, self.fetcher = self.fetcher, None
        if self._renewal is None:
            return stopper(self._keys.name, None, fetcher, None, None)
        return self._renewal.stopper(fetcher)

    def _finish(self, failure: BaseException | None) -> None:
        if failure is not None:
            self._runs.emit("error", failure)

    # -- runs: taken, moving, moved ----------------------------------------

    def taken(self, job_id: str, token: str, sent_ms: int, sent_wall_ms: int) -> None:
        """Track a job the fetch took; runs on the fetch thread, when the server answers."""
        if self._renewal is not None:
            self._renewal.taken(job_id, token, sent_ms, sent_wall_ms)

    def abandoned(self, job_id: str, token: str) -> None:
        """Untrack a job whose fetch nobody awaits any more: no processor will run it."""
        if self._renewal is not None:
            self._renewal.abandoned(job_id, token)

    def moving(self, job_id: str, token: str) -> bool:
        """Mark the run holding ``token`` as being moved; return whether one was."""
        return self._runs.moving(job_id, token)

    def moved(self, job_id: str, token: str, *, stayed: bool) -> None:
        """The move of the run holding ``token`` ended: the job left, or ``stayed`` active."""
        self._runs.moved(job_id, token, stayed=stayed)

    def release(self, job_id: str, token: str) -> None:
        """Untrack the run holding ``token``, if it is still the job's run."""
        self._runs.release(job_id, token)

    def release_unstarted(self, job_id: str, token: str) -> None:
        """Untrack the run of ``job_id`` fetched with ``token`` if its processor never started.

        bullmq gave up on the job between its fetch and its processor (an
        ``active`` listener raised, the job's data could not be read): its
        lock is left to expire, and a stalled check hands it on.
        """
        self._runs.release_unstarted(job_id, token)

    async def lock_held(self, job_id: str, token: str) -> bool:
        """Whether the job's lock still holds ``token``; ``True`` when it cannot be read.

        Read with the renewal client, whose timeouts are bounded, on a thread
        of this manager's: the loop goes on meanwhile. An unreadable lock
        counts as held: renewing a lock that is gone costs one report, leaving
        a held one unrenewed loses the job.
        """
        return True if self._renewal is None else await self._renewal.lock_held(job_id, token)

    def _untrack(self, job_id: str, token: str) -> None:
        if self._renewal is not None:
            self._renewal.untrack(job_id, token)


def _current_task() -> asyncio.Task[Any] | None:
    try:
        return asyncio.current_task()
    except RuntimeError:
        return None
