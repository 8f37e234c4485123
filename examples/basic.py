"""The plain cycle: start a manager, track a job's lock, untrack it, stop.

Run it with ``python examples/basic.py`` (``REDIS_URL``, or a private server).
"""

from __future__ import annotations

import time
import uuid

import redis

import actors
from actors.embedded import server_url

LOCK_MS = 1000  #: Lock TTL, in milliseconds: short, so the example ends in seconds.


def main() -> int:
    """Hold one job's lock for two TTLs through a manager, then let it go."""
    keys, token = actors.QueueKeys("basic"), str(uuid.uuid4())
    with server_url() as url, redis.Redis.from_url(url, socket_timeout=5) as client:
        # Step 1: take the job's lock, as a queue's move-to-active does.
        client.set(keys.lock("job-1"), token, nx=True, px=LOCK_MS)
        # Step 2: one manager per queue; tracking the job renews its lock from now on.
        manager = actors.start_link(connection=url, keys=keys, lock_duration=LOCK_MS)
        actors.track_job(manager, "job-1", token)
        time.sleep(2 * LOCK_MS / 1000)  # the job's work, longer than its lock's TTL
        held = client.get(keys.lock("job-1")) == token.encode()
        print(f"lock held after {2 * LOCK_MS} ms: {held}")
        # Step 3: untrack before releasing the lock, then stop the manager.
        actors.untrack_job(manager, "job-1", wait=True)
        client.delete(keys.lock("job-1"))
        actors.stop(manager)
    return 0 if held else 1


if __name__ == "__main__":
    raise SystemExit(main())
