"""The :class:`~actors.LockManager` that renews a bullmq worker's locks, seen from its loop.

The manager runs on threads of its own; what it reports (a lost lock,
renewed locks, an error) is handed to the worker's event loop, where the
table of runs is kept, and calls from the loop to it never wait.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from typing import TYPE_CHECKING

from actors._loop import call_in_loop
from actors.api import start_link, track_job, untrack_job
from actors.bullmq._close import stopper
from actors.bullmq._runs import Run, monotonic_from_wall
from actors.lost import LockLost
from actors.readback import lock_holds

if TYPE_CHECKING:
    from collections.abc import Callable

    import redis

    from actors.bullmq._hooks import Fetcher
    from actors.bullmq._manager import ActorLockManager
    from actors.bullmq._runs import Runs
    from actors.lost import LostLock
    from actors.ref import ManagerRef

__all__ = ["Renewal"]

logger = logging.getLogger("actors.bullmq")


class Renewal:
    """A worker's renewing manager: started on the worker's loop, reporting back to it.

    Args:
        owner: The worker's lock manager (its keys, durations, ``closed``).
        runs: The worker's table of runs, which hears the reports on the loop.
        conn: The client to renew with.
        owns_connection: Whether ``conn`` was built for this and is closed with it.
        max_batch: Most ids per script call.
    """

    def __init__(
        self,
        owner: ActorLockManager,
        runs: Runs,
        conn: redis.Redis | redis.RedisCluster,
        owns_connection: bool,
        max_batch: int,
    ) -> None:
        self._owner = owner
        self._runs = runs
        #: The synchronous client the manager renews with.
        self.connection = conn
        self._owns_connection = owns_connection
        self._max_batch = max_batch
        #: The running manager: ``None`` before :meth:`start` and once stopped.
        self.manager: ManagerRef | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reader: concurrent.futures.ThreadPoolExecutor | None = None

    def start(self) -> None:
        """Start the manager from the worker's running loop; it renews every run from now on."""
        owner = self._owner
        self._loop = asyncio.get_running_loop()
        self.manager = start_link(
            connection=self.connection,
            keys=owner.keys,
            lock_duration=owner.lock_duration,
            lock_renew_time=owner.lock_renew_time,
            on_lock_renewal_failed=self._lost_from_thread,
            on_locks_renewed=self._renewed_from_thread,
            on_error=self._error_from_thread,
            max_batch=self._max_batch,
        )
        # Jobs tracked before the start are renewed from now on.
        for job_id, run in self._runs.items():
            self.track(job_id, run.token, monotonic_from_wall(run.wall_ms))

    def track(self, job_id: str, token: str, taken_ms: int) -> None:
        """Tell the manager to renew a lock, taken at ``taken_ms`` (monotonic milliseconds)."""
        # Watched, by this object (see tell): trusted only until its deadline.
        if self.manager is not None:
            track_job(self.manager, job_id, token, ts=taken_ms, notify=self)

    def untrack(self, job_id: str, token: str) -> None:
        """Tell the manager to stop renewing a lock."""
        if self.manager is not None:
            untrack_job(self.manager, job_id, token=token, notify=self)

    def tell(self, message: object) -> None:
        """Hear of a lost lock from the manager, as every job's ``notify`` target.

        Told on the manager's thread (its timer's, at a watched lock's
        deadline): handed to the worker's loop, which aborts the run's signal.
        """
        if isinstance(message, LockLost):
            self.to_loop(self._on_lost, [(message.job_id, message.token, message.reason)])

    def to_loop(self, callback: Callable[..., object], *args: object) -> None:
        """Hand ``callback(*args)`` to the worker's loop from another thread, and return."""
        loop = self._loop
        if loop is not None and not self._owner.closed and not call_in_loop(loop, callback, *args):
            logger.debug("worker loop of queue %r closed; report dropped", self._owner.keys.name)

    def taken(self, job_id: str, token: str, sent_ms: int, sent_wall_ms: int) -> None:
        """Track a job the fetch took; runs on the fetch thread, when the server answers."""
        # The loop hears of the run before the manager can report on it:
        # calls handed to the loop keep their order.
        self.to_loop(self._fetched, job_id, Run(token, sent_wall_ms))
        self.track(job_id, token, sent_ms)

    def abandoned(self, job_id: str, token: str) -> None:
        """Untrack a job whose fetch nobody awaits any more: no processor will run it."""
        self.untrack(job_id, token)
        self.to_loop(self._runs.release, job_id, token)

    def _lost_from_thread(self, lost: list[LostLock]) -> None:
        self.to_loop(self._on_lost, [(item.job_id, item.token, item.reason) for item in lost])

    def _renewed_from_thread(self, job_ids: list[str]) -> None:
        self.to_loop(self._on_renewed, [str(job_id) for job_id in job_ids])

    def _error_from_thread(self, error: Exception) -> None:
        self.to_loop(self._runs.emit, "error", error)

    # -- on the worker's loop ---------------------------------------------

    def _fetched(self, job_id: str, run: Run) -> None:
        if not self._owner.closed:
            self._runs.fetched(job_id, run)

    def _on_lost(self, lost: list[tuple[str, str, str]]) -> None:
        if not self._owner.closed:
            self._runs.lost(lost)

    def _on_renewed(self, job_ids: list[str]) -> None:
        if not self._owner.closed:
            self._runs.emit("locksRenewed", {"count": len(job_ids), "jobIds": job_ids})

    async def lock_held(self, job_id: str, token: str) -> bool:
        """Whether the job's lock still holds ``token``; ``True`` when it cannot be read.

        Read with the renewal client, whose timeouts are bounded, on a thread
        of this manager's: the loop goes on meanwhile. An unreadable lock
        counts as held: renewing a lock that is gone costs one report, leaving
        a held one unrenewed loses the job.
        """
        keys = self._owner.keys
        if self._owner.closed:
            return True
        if self._reader is None:
            self._reader = concurrent.futures.ThreadPoolExecutor(1, f"bullmq-read-{keys.name}")
        try:
            read = self._reader.submit(lock_holds, self.connection, keys, job_id, token)
            return await asyncio.wrap_future(read)
        except Exception:
            logger.warning(
                "queue %r: could not read job %r's lock after its move failed; renewing it again",
                keys.name,
                job_id,
                exc_info=True,
            )
            return True

    def stopper(self, fetcher: Fetcher | None) -> Callable[[], None]:
        """Let go of the manager; return what stops it and ``fetcher``, to run off the loop."""
        manager, self.manager = self.manager, None
        reader, self._reader = self._reader, None
        conn = self.connection if self._owns_connection else None
        return stopper(self._owner.keys.name, manager, fetcher, reader, conn)
