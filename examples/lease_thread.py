"""A job on a thread holds its lock with a lease and stops as soon as it is lost.

Run it with ``python examples/lease_thread.py``; it uses ``REDIS_URL`` or starts a
private server.
"""

from __future__ import annotations

import time
import uuid

import redis

import actors
from actors import lease
from actors.embedded import server_url

#: Lock TTL, in milliseconds: short, so the example ends in about a second.
LOCK_MS = 1000


def run(url: str, steps: int = 30, steal_at: int | None = 5) -> tuple[int, str | None]:
    """Work on one job in steps; return the steps done and why the lock was lost."""
    keys = actors.QueueKeys("thread-jobs")
    client = redis.Redis.from_url(url, socket_timeout=5)
    # Step 1: one manager renews every lock this worker holds.
    manager = actors.start_link(connection=url, keys=keys, lock_duration=LOCK_MS)
    # Step 2: take the job's lock, as a worker's move-to-active does.
    token = str(uuid.uuid4())
    client.set(keys.lock("job-1"), token, nx=True, px=LOCK_MS)
    done, reason = 0, None
    try:
        # Step 3: hold the lock with a lease while the job runs.
        with lease(manager, "job-1", token) as held:
            for step in range(steps):
                # Step 4: between steps, check: it raises once the lock is lost.
                held.check()
                if step == steal_at:
                    client.set(keys.lock("job-1"), "another-worker", px=LOCK_MS)
                time.sleep(LOCK_MS / 20_000)  # the step's work
                done += 1
        # Step 5: leaving untracked the job; now the lock may be deleted.
        client.delete(keys.lock("job-1"))
    except actors.LockLost as lost:
        # Another worker owns the job now: stop, and leave its lock alone.
        reason = lost.reason
    finally:
        actors.stop(manager)
        client.close()
    return done, reason


if __name__ == "__main__":
    with server_url() as url:
        steps, why = run(url)
    print(f"did {steps} steps; lock lost: {why}")
