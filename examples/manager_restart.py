"""Start a new LockManager when the old one stops, and keep every held lock alive.

A manager that stops (an operator, a stray ``ActorRegistry.stop_all()``, a
bug) tells every job tracked with ``notify`` :class:`actors.LockLost` with the
reason ``"manager_stopped"``: nobody renews that lock now. Here a ``Keeper``
actor holds the worker's locks and tracks them with ``notify=self.actor_ref``.
On the first such report it starts a new manager, tracks every lock it still
holds again, and renews them at once: the old manager may have been about to
renew them, and the new one's first tick is an interval away.

Run it with ``python examples/manager_restart.py``; it uses ``REDIS_URL`` or
starts a private server.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pykka
import redis

import actors
from actors.embedded import server_url
from actors.timing import monotonic_ms

#: Lock TTL, in milliseconds: short, so the example ends in seconds.
LOCK_MS = 1500
KEYS = actors.QueueKeys("restartable")


class Keeper(pykka.ThreadingActor):
    """Holds a worker's locks through a manager, and replaces the manager when it stops.

    Args:
        url: The server's URL.
    """

    use_daemon_thread = True

    def __init__(self, url: str) -> None:
        super().__init__()
        self._url = url
        #: Job id -> (token, when the lock was taken, in monotonic ms).
        self._held: dict[str, tuple[str, int]] = {}
        self.manager = self._start_manager()
        self.restarts = 0

    def _start_manager(self) -> actors.ManagerRef:
        return actors.start_link(connection=self._url, keys=KEYS, lock_duration=LOCK_MS)

    def hold(self, job_id: str, token: str) -> None:
        """Keep ``job_id``'s lock, which ``token`` holds, alive (call through a proxy)."""
        self._held[job_id] = (token, monotonic_ms())
        actors.track_job(self.manager, job_id, token, notify=self.actor_ref)

    def release(self, job_id: str) -> None:
        """Stop renewing ``job_id``'s lock, and wait until the manager has (through a proxy)."""
        self._held.pop(job_id, None)
        actors.untrack_job(self.manager, job_id, wait=True)

    def on_receive(self, message: Any) -> None:
        """Replace a stopped manager; forget a lock lost for any other reason."""
        if not isinstance(message, actors.LockLost):
            return
        if message.reason != "manager_stopped":
            held = self._held.get(message.job_id)
            # The token says which lock is lost: forget it, not a newer one of the job.
            if held is not None and held[0] == message.token:
                del self._held[message.job_id]
            return
        # Every job reports the same stop: the first report replaces the manager.
        if self.manager.is_alive():
            return
        self.manager = self._start_manager()
        self.restarts += 1
        for job_id, (token, taken_at) in self._held.items():
            # Stamped when taken: the new manager never thinks a lock younger than it is ...
            actors.track_job(self.manager, job_id, token, ts=taken_at, notify=self.actor_ref)
        # ... and this "renew now" renews every one already due, in one call.
        self.manager.tell(actors.ExtendLocks())

    def on_stop(self) -> None:
        """Untrack the locks, then stop the manager (no one is left to report to)."""
        for job_id in self._held:
            actors.untrack_job(self.manager, job_id)
        actors.stop(self.manager)


def main() -> int:
    """Hold five locks, stop the manager, and check the locks outlive two more TTLs."""
    with server_url() as url:
        client = redis.Redis.from_url(url, socket_timeout=5, decode_responses=True)
        keeper = Keeper.start(url).proxy()
        try:
            # Step 1: take five jobs' locks, as a queue's move-to-active does, and hold them.
            tokens = {f"job-{n}": str(uuid.uuid4()) for n in range(1, 6)}
            for job_id, token in tokens.items():
                client.set(KEYS.lock(job_id), token, nx=True, px=LOCK_MS)
                keeper.hold(job_id, token).get()

            # Step 2: the manager stops; the keeper starts a new one.
            first = keeper.manager.get()
            actors.stop(first)
            deadline = time.monotonic() + LOCK_MS / 1000
            while keeper.manager.get() is first and time.monotonic() < deadline:
                time.sleep(0.01)
            second = keeper.manager.get()
            tracked = actors.get_active_job_count(second)
            print(f"manager stopped; restarts: {keeper.restarts.get()}; new one tracks {tracked}")

            # Step 3: two TTLs later every lock is still ours.
            time.sleep(2 * LOCK_MS / 1000)
            held = [job for job, token in tokens.items() if client.get(KEYS.lock(job)) == token]
            print(f"{len(held)} of {len(tokens)} locks held {2 * LOCK_MS} ms after the stop")

            # Step 4: done: release the jobs, then delete their locks.
            for job_id in tokens:
                keeper.release(job_id).get()
            client.delete(*(KEYS.lock(job_id) for job_id in tokens))
        finally:
            keeper.actor_ref.stop()
            client.close()
    return 0 if len(held) == len(tokens) else 1


if __name__ == "__main__":
    raise SystemExit(main())
