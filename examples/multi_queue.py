"""One worker serving several queues: one LockManager per queue.

The renewal script takes one queue's key prefix and stalled set, so a manager
renews the locks of one queue. A worker that takes jobs from several queues
starts one manager per queue and tracks each job with its own queue's manager.

Run it with ``python examples/multi_queue.py``; it uses ``REDIS_URL`` or
starts a private server.
"""

from __future__ import annotations

import functools
import threading
import time
import uuid

import redis

import actors
from actors.embedded import server_url

#: Lock TTL, in milliseconds: short, so the example ends in seconds.
LOCK_MS = 1500
QUEUES = ("emails", "images", "reports")


def main() -> int:
    """Hold two jobs on each of three queues for one and a half TTLs."""
    renewed: dict[str, set[str]] = {name: set() for name in QUEUES}
    lost: list[str] = []
    guard = threading.Lock()

    def on_renewed(queue: str, ids: list[str]) -> None:
        # Each manager calls this on its own thread: several may at once.
        with guard:
            renewed[queue].update(ids)

    with server_url() as url:
        client = redis.Redis.from_url(url, socket_timeout=5, decode_responses=True)
        # Step 1: one manager per queue.
        managers = {
            name: actors.start_link(
                connection=url,
                keys=actors.QueueKeys(name),
                lock_duration=LOCK_MS,
                on_locks_renewed=functools.partial(on_renewed, name),
                on_lock_renewal_failed=lost.extend,
            )
            for name in QUEUES
        }
        try:
            # Step 2: take two jobs on every queue (SET NX PX, as move-to-active
            # does) and track each with its own queue's manager.
            tokens: dict[tuple[str, str], str] = {}
            for name in QUEUES:
                for n in (1, 2):
                    job_id, token = f"{name}-{n}", str(uuid.uuid4())
                    client.set(actors.QueueKeys(name).lock(job_id), token, nx=True, px=LOCK_MS)
                    actors.track_job(managers[name], job_id, token)
                    tokens[name, job_id] = token

            # Step 3: work for one and a half TTLs while the managers renew.
            time.sleep(1.5 * LOCK_MS / 1000)
            held = sum(
                client.get(actors.QueueKeys(name).lock(job_id)) == token
                for (name, job_id), token in tokens.items()
            )

            # Step 4: done: untrack each job and wait until its manager has, then
            # delete the lock (a tick would otherwise find it gone: "lost").
            for name, job_id in tokens:
                actors.untrack_job(managers[name], job_id, wait=True)
                client.delete(actors.QueueKeys(name).lock(job_id))
            stats = {name: actors.get_stats(manager) for name, manager in managers.items()}
        finally:
            for manager in managers.values():
                actors.stop(manager)
            client.close()

    print(f"{held} of {len(tokens)} locks held after {1.5 * LOCK_MS:.0f} ms; lost: {lost}")
    for name in QUEUES:
        print(
            f"{name:8} renewed {sorted(renewed[name])} "
            f"({stats[name].renewed} renewals in {stats[name].script_calls} script calls)"
        )
    return 0 if held == len(tokens) and not lost else 1


if __name__ == "__main__":
    raise SystemExit(main())
