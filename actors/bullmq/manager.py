"""The lock manager a bullmq ``Worker`` calls, renewing through a manager's threads."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
from typing import TYPE_CHECKING, Any

import pykka

from actors.aio import answer, call_in_loop
from actors.api import start_link
from actors.bullmq.hooks import attempt, must_wait, off_the_loop, renewal_client, stopper
from actors.bullmq.runs import (
    LOCK_LOST,
    RUN_TOKEN,
    LockController,
    Run,
    Runs,
    Trust,
    abort_reason,
    monotonic_from_wall,
)
from actors.connection import command_timeout, is_cluster
from actors.jobs import Validity
from actors.keys import QueueKeys
from actors.messages import LockLost, TrackJob, UntrackJob
from actors.ref import ManagerStopped
from actors.report import TellsInBatches
from actors.scripts import DEFAULT_MAX_BATCH, lock_holds, require_replicas, require_wait
from actors.timing import Timing

if TYPE_CHECKING:
    from collections.abc import Callable

    import redis

    from actors.bullmq.hooks import Fetcher
    from actors.bullmq.runs import LockSignal
    from actors.messages import LostLock
    from actors.process.take import Taken
    from actors.ref import ManagerRef, Outbox
    from actors.scripts import Replicas

__all__ = ["LOCK_LOST", "ActorLockManager"]

logger = logging.getLogger("actors.bullmq")


class ActorLockManager(TellsInBatches):
    """bullmq-py's lock manager, renewing from a :class:`~actors.LockManager`'s threads.

    It has the interface the ``Worker`` uses and behaves the same, except:

    - renewal runs on the manager's threads (or its child process), so a
      processor that blocks the loop keeps its lock, and so do the others;
    - a job is tracked from the taking of its lock until its move is answered
      (in process mode the child runs the fetch and tracks the job it took
      before the worker reads the answer, whatever holds the worker's GIL);
    - a lost lock aborts the job's ``AbortSignal`` with a reason starting
      with :data:`LOCK_LOST`; ``signal.aborted`` reads ``True`` as soon as
      the manager knows, even right after a call that blocked the loop;
    - a graceful close goes on renewing every job the worker still
      processes until bullmq has moved it.

    Every method but :meth:`close` runs on the worker's event loop, and so
    do the listeners of the events it emits.

    Args:
        worker: The bullmq ``Worker``; its ``emit`` delivers the events.
        lock_renew_time: The worker's ``lockRenewTime``, in milliseconds;
            ``0`` or less turns renewal off, as in bullmq-py.
        lock_duration: The worker's ``lockDuration``, in milliseconds.
        worker_id: The worker's id, for diagnostics.
        worker_name: The worker's name, if it has one.
        connection: A ``redis.Redis``, a ``redis.RedisCluster`` or a URL; when
            ``None``, built from the worker's ``connection`` option.
        max_batch: Most ids per script call (see :func:`actors.start_link`).
        isolation: ``"thread"`` or ``"process"`` (see :func:`actors.start_link`).
        replicas: Replicas that must confirm each renewal (see :func:`actors.start_link`).

    Raises:
        TypeError: A duration is not an ``int``, or the connection cannot be
            used (see :func:`~actors.bullmq.use_actor_lock_manager`).
        ValueError: ``lock_renew_time`` is not below ``lock_duration``, or
            ``replicas`` is out of range or waits longer than a renewal may.
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
        isolation: str = "thread",
        replicas: int | Replicas | None = None,
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
        self.fetcher: Fetcher | None = None
        self._shutdown: asyncio.Future[None] | None = None
        self._changed: asyncio.Event | None = None
        self._max_batch = max_batch
        self._isolation = isolation
        #: The running manager: ``None`` before :meth:`start`, once closed, and with renewal off.
        self.manager: ManagerRef | None = None
        #: Where the runs' tracks and untracks go to the manager, in one go per tick.
        self._outbox: Outbox | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        #: The thread the worker's loop runs on (once started).
        self._loop_thread: int | None = None
        self._reader: concurrent.futures.ThreadPoolExecutor | None = None
        #: Each run's signal, by ``(job_id, token)``: a teller thread marks it lost at once.
        self._signals: dict[tuple[str, str], LockSignal] = {}
        #: How long the manager trusts a lock after a confirmed send, in ms (once started).
        self._span = 0
        # bullmq-py turns renewal off for lockRenewTime <= 0; so does this.
        self.renews = not (
            isinstance(lock_renew_time, (int, float))
            and not isinstance(lock_renew_time, bool)
            and lock_renew_time <= 0
        )
        #: The synchronous client the manager renews with; ``None`` with renewal off.
        self.connection: redis.Redis | redis.RedisCluster | None = None
        self._owns_connection = False
        replicas = require_replicas(replicas)  # checked with renewal off too
        if self.renews:
            self.connection, self._owns_connection = renewal_client(
                worker, connection, lock_duration, lock_renew_time
            )
            timing = Timing(lock_duration, lock_renew_time)
            limit = command_timeout(timing, cluster=is_cluster(self.connection)) * 1000
            try:
                replicas = require_replicas(replicas, limit_ms=limit, conn=self.connection)
                if replicas is not None:
                    require_wait(self.connection, replicas)
            except BaseException:
                if self._owns_connection:
                    self.connection.close()
                raise
        #: The replicas each renewal waits for, if any.
        self.replicas = replicas

    @property
    def keys(self) -> QueueKeys:
        """The queue's keys: the worker's prefix and queue name."""
        return self._keys

    @property
    def tracked_jobs(self) -> dict[str, dict[str, Any]]:
        """A snapshot of the tracked jobs, shaped as bullmq-py's attribute.

        Each id maps to ``{"token", "ts", "abort_controller"}``; changing it changes nothing.
        """
        return self._runs.snapshot()

    def start(self) -> None:
        """Start the manager, on the worker's running loop. Idempotent.

        Raises:
            RuntimeError: No event loop is running in this thread.
        """
        if self.closing or self.connection is None or self.manager is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self.manager = start_link(
            connection=self.connection,
            keys=self._keys,
            lock_duration=self.lock_duration,
            lock_renew_time=self.lock_renew_time,
            on_lock_renewal_failed=self._lost_from_thread,
            on_locks_renewed=self._renewed_from_thread,
            on_error=self._error_from_thread,
            max_batch=self._max_batch,
            isolation=self._isolation,
            replicas=self.replicas,
        )
        self._span = self.manager.trusted_for()
        self._outbox = self.manager.outbox()
        # Jobs tracked before the start are renewed from now on.
        for job_id, run in list(self._runs.items()):
            trust = self._trust(monotonic_from_wall(run.wall_ms))
            self._runs.trusted(job_id, run.token, trust)
            self._track(job_id, run.token, trust)

    def track_job(
        self,
        job_id: str,
        token: str,
        ts: int,
        should_create_controller: bool = False,
    ) -> LockController | None:
        """Renew ``job_id``'s lock, held with ``token``, from now on.

        bullmq calls it when the job's processor task starts, with ``ts`` in
        wall-clock milliseconds. A job the fetch already tracked keeps the
        time its lock was taken; a controller made for a lock already lost
        starts aborted, and so does one of a run this worker has taken its
        job from again since (a new token), which is then not tracked. The
        controller's signal reads the lock's deadline itself while the run
        holds the lock.

        Returns:
            The ``AbortController`` if ``should_create_controller`` (``None``
            when closed, or for an empty id).
        """
        if self.closed or not job_id:
            return None
        job_id = str(job_id)
        # Seen by untrack_job later in the same task: which run is ending.
        RUN_TOKEN.set(token)
        controller = LockController() if should_create_controller else None
        if self._runs.stale(job_id, token, controller):
            # Taken again by this worker before this processor started: the lock
            # is the newer run's, which this run must not take from it.
            return controller
        if controller is not None:
            self._signals[(job_id, token)] = controller.signal
        task = _current_task()
        if task is not None:
            task.add_done_callback(self._poke)
        if self._runs.started(job_id, token, ts, controller, task):
            trust = self._trust(monotonic_from_wall(ts))
            self._runs.trusted(job_id, token, trust)
            self._track(job_id, token, trust)
        self._poke()
        return controller

    def untrack_job(self, job_id: str) -> None:
        """Stop renewing ``job_id``'s lock: bullmq has moved the job, or gave it up.

        bullmq calls it when a run ends; a new run of the job (taken again,
        with a new token) is left alone.
        """
        job_id = str(job_id)
        run = self._runs.get(job_id)
        ending = RUN_TOKEN.get()
        if run is not None and (ending is None or ending == run.token):
            self._runs.release(job_id, run.token)

    def cancel_job(self, job_id: str, reason: str | None = None) -> bool:
        """Abort ``job_id``'s signal with ``reason``; return whether it is tracked with one."""
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
        processes until its move is answered; ``worker.close(force=True)``
        stops at once. Threads and clients are then stopped off the loop;
        every call waits for that one shutdown.
        """
        self.closing = True
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            # No loop: a run() finalized by the garbage collector after its loop closed.
            self._finish(attempt(self._release_all()))
            return
        if self._shutdown is None:
            self._shutdown = asyncio.ensure_future(self._shut_down())
        self._poke()
        await asyncio.shield(self._shutdown)

    async def _shut_down(self) -> None:
        while self.manager is not None and must_wait(
            self.worker, (r for _, r in self._runs.items())
        ):
            if self._changed is None:
                self._changed = asyncio.Event()
            self._changed.clear()
            await self._changed.wait()
        fetcher = self.fetcher
        self._finish(await off_the_loop(self._keys.name, self._release_all()))
        if fetcher is not None:
            await fetcher.disconnect()

    def _poke(self, *_: object) -> None:
        if self._changed is not None:
            self._changed.set()

    def _release_all(self) -> Callable[[], None]:
        """Forget every job; return what stops the threads and clients, off the loop."""
        self.closed = True
        self._runs.clear()
        self._signals.clear()
        fetcher, self.fetcher = self.fetcher, None
        manager, self.manager = self.manager, None
        self._outbox = None
        reader, self._reader = self._reader, None
        conn = self.connection if self._owns_connection else None
        return stopper(self._keys.name, manager, fetcher, reader, conn)

    def _finish(self, failure: BaseException | None) -> None:
        if failure is not None:
            self._runs.emit("error", failure)

    def _trust(self, taken_ms: int) -> Trust | None:
        """The deadline of a lock taken at ``taken_ms``, until the manager answers its track."""
        manager = self.manager
        if manager is None:
            return None
        return Trust(taken_ms, self._span, manager.clock)

    def _track(self, job_id: str, token: str, trust: Trust | None, *, wake: bool = False) -> None:
        # Watched by this object (see tell): trusted only until its deadline,
        # which the manager's answer (the lock's Validity) gives the run's signal.
        # Read with the manager's next message or tick: the run trusts the
        # taking's deadline until then (see Trust), and the track keeps its time.
        outbox = self._outbox
        if outbox is None or trust is None:
            return
        with contextlib.suppress(ManagerStopped):
            trust.reply = outbox.put(TrackJob(job_id, token, trust.taken_ms, self), wake=wake)

    def _untrack(self, job_id: str, token: str) -> None:
        self._signals.pop((job_id, token), None)
        if self._outbox is not None:
            with contextlib.suppress(ManagerStopped):
                self._outbox.put(UntrackJob(job_id, token, self))

    def tell(self, message: object) -> None:
        """Hear of a lost lock from the manager, as every job's ``notify`` target."""
        if isinstance(message, LockLost):
            self.tell_batch([message])

    def tell_batch(self, messages: list[LockLost]) -> None:
        """Hear of the locks one report lost: their runs' signals read aborted at once.

        On a thread the manager tells targets on; the loop then aborts each
        signal for its waiters and emits the events, once for the report.
        """
        for message in messages:
            signal = self._signals.get((message.job_id, message.token))
            if signal is not None:
                signal.lose(abort_reason(message.job_id, message.reason))
        self._to_loop(self._on_lost, [(m.job_id, m.token, m.reason) for m in messages])

    def _to_loop(self, callback: Callable[..., object], *args: object) -> None:
        loop = self._loop
        if loop is not None and not self.closed and not call_in_loop(loop, callback, *args):
            logger.debug("worker loop of queue %r closed; report dropped", self._keys.name)

    def _lost_from_thread(self, lost: list[LostLock]) -> None:
        self._to_loop(self._on_lost, [(item.job_id, item.token, item.reason) for item in lost])

    def _renewed_from_thread(self, job_ids: list[str]) -> None:
        self._to_loop(self._on_renewed, [str(job_id) for job_id in job_ids])

    def _error_from_thread(self, error: Exception) -> None:
        self._to_loop(self._runs.emit, "error", error)

    def _on_lost(self, lost: list[tuple[str, str, str]]) -> None:
        if not self.closed:
            self._runs.lost(lost)

    def _on_renewed(self, job_ids: list[str]) -> None:
        if not self.closed:
            self._runs.emit("locksRenewed", {"count": len(job_ids), "jobIds": job_ids})

    def taker(self) -> Callable[..., concurrent.futures.Future[Taken]] | None:
        """What runs bullmq's fetch in the manager's child (process mode), else ``None``."""
        manager = self.manager
        return None if manager is None else manager.taker()

    def taken(
        self, job_id: str, token: str, sent_ms: int, sent_wall_ms: int, *, late: bool = False
    ) -> None:
        """Track a job a fetch took, on the thread that read the answer (the loop's, or not).

        A ``late`` track (found while the loop was held) wakes the manager,
        whose next tick may come after the lock's first renewal is due.
        """
        # Trusted from the fetch's send: the server took the lock after it.
        trust = self._trust(sent_ms)
        run = Run(token, sent_wall_ms, trust=trust)
        # Handed to the loop first: the manager's reports on the run come after.
        if threading.get_ident() == self._loop_thread:
            self._fetched(job_id, run)
        else:
            self._to_loop(self._fetched, job_id, run)
        self._track(job_id, token, trust, wake=late)

    async def taken_by_child(
        self, job_id: str, token: str, sent_ms: int, sent_wall_ms: int
    ) -> None:
        """Track a job the manager's child took (process mode); on the loop, before its run.

        The child renews the lock from its taking. The run starts once the
        manager has the track and the child its word: a processor that holds
        the GIL from its first line then keeps the job's deadline too.
        """
        trust = self._trust(sent_ms)
        self._fetched(job_id, Run(token, sent_wall_ms, trust=trust))
        manager = self.manager
        if manager is None or trust is None:
            return
        try:
            asked = manager.ask(TrackJob(job_id, token, trust.taken_ms, self), block=False)
            told = await answer(manager, asked, timeout=self.lock_duration / 1000)
        except (ManagerStopped, pykka.Timeout):
            return  # tracked all the same, a little later; or nobody renews any more
        if isinstance(told, Validity):
            trust.validity = told

    def _fetched(self, job_id: str, run: Run) -> None:
        if not self.closed:
            self._runs.fetched(job_id, run)

    def abandoned(self, job_id: str, token: str) -> None:
        """Untrack a job whose fetch nobody awaits any more: no processor will run it."""
        self._untrack(job_id, token)
        self._to_loop(self._runs.release, job_id, token)

    def moving(self, job_id: str, token: str) -> bool:
        """Mark the run holding ``token`` as being moved; return whether one was.

        The manager goes on renewing the lock, and hears that the move is
        under way: a lock it then finds gone is the move's doing.
        """
        if not self._runs.moving(job_id, token):
            return False
        self._releasing(job_id, token, True)
        return True

    def moved(self, job_id: str, token: str, *, stayed: bool) -> None:
        """The move of the run holding ``token`` ended: the job left, or ``stayed`` active."""
        if stayed and self._runs.get(job_id) is not None:
            self._releasing(job_id, token, False)
        self._runs.moved(job_id, token, stayed=stayed)

    def _releasing(self, job_id: str, token: str, releasing: bool) -> None:
        manager, outbox = self.manager, self._outbox
        if manager is not None and outbox is not None:
            message = TrackJob(job_id, token, manager.clock(), self, releasing=releasing)
            with contextlib.suppress(ManagerStopped):
                outbox.put(message)

    def release(self, job_id: str, token: str) -> None:
        """Untrack the run holding ``token``, if it is still the job's run."""
        self._runs.release(job_id, token)

    def release_unstarted(self, job_id: str, token: str) -> None:
        """Untrack the run of ``job_id`` fetched with ``token`` if its processor never started.

        bullmq gave up on the job before its processor (an ``active``
        listener raised, unreadable data): its lock is left to expire.
        """
        self._runs.release_unstarted(job_id, token)

    async def lock_held(self, job_id: str, token: str) -> bool:
        """Whether the job's lock still holds ``token``; ``True`` when it cannot be read.

        Read off the loop with the bounded renewal client. Unreadable counts
        as held: renewing a lock that is gone costs one report, leaving a held
        one unrenewed loses the job.
        """
        if self.closed or self.connection is None:
            return True
        if self._reader is None:
            name = f"bullmq-read-{self._keys.name}"
            self._reader = concurrent.futures.ThreadPoolExecutor(1, name)
        try:
            read = self._reader.submit(lock_holds, self.connection, self._keys, job_id, token)
            return await asyncio.wrap_future(read)
        except Exception:
            logger.warning(
                "queue %r: could not read job %r's lock after its move failed; renewing it again",
                self._keys.name,
                job_id,
                exc_info=True,
                extra={"queue": self._keys.name, "job_id": job_id},
            )
            return True


def _current_task() -> asyncio.Task[Any] | None:
    try:
        return asyncio.current_task()
    except RuntimeError:
        return None
