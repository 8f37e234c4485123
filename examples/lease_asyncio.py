"""An asyncio job holds its lock with a lease and is cancelled as soon as it is lost.

The job's work and the lease's ``wait_async()`` race; whichever ends first
wins. Nothing here blocks the event loop: the lease's exit and the query at
the end await the manager through :mod:`actors.aio`.

Run it with ``python examples/lease_asyncio.py``; it uses ``REDIS_URL`` or starts
a private server.
"""

from __future__ import annotations

import asyncio
import uuid

import redis

import actors
from actors import aio, lease
from actors.embedded import server_url

#: Lock TTL, in milliseconds: short, so the example ends in about a second.
LOCK_MS = 1000


async def work(client: redis.Redis, lock: str) -> str:
    """The job: a few seconds of awaiting; halfway, another worker takes its lock."""
    await asyncio.sleep(LOCK_MS / 4000)
    await asyncio.to_thread(client.set, lock, "another-worker", px=LOCK_MS)
    await asyncio.sleep(3 * LOCK_MS / 1000)
    return "done"


async def run(url: str) -> tuple[str, int]:
    """Run one job; return how it ended and how many locks the manager saw lost."""
    keys = actors.QueueKeys("async-jobs")
    client = redis.Redis.from_url(url, socket_timeout=5)
    # Step 1: one manager renews every lock this worker holds.
    manager = actors.start_link(connection=url, keys=keys, lock_duration=LOCK_MS)
    # Step 2: take the job's lock, as a worker's move-to-active does.
    token = str(uuid.uuid4())
    client.set(keys.lock("job-1"), token, nx=True, px=LOCK_MS)
    # Step 3: hold it with a lease; race the work against the loss of the lock.
    async with lease(manager, "job-1", token) as held:
        job = asyncio.ensure_future(work(client, keys.lock("job-1")))
        lost = asyncio.ensure_future(held.wait_async())
        await asyncio.wait({job, lost}, return_when=asyncio.FIRST_COMPLETED)
        # Step 4: the lock went first: cancel the work, the job is not ours now.
        ended = f"cancelled: lock {held.reason}" if held.lost else await job
        job.cancel()
        lost.cancel()
    # Step 5: ask the manager without blocking the loop, then stop it.
    stats = await aio.get_stats(manager)
    await aio.stop(manager)
    client.close()
    return ended, stats.lost


if __name__ == "__main__":
    with server_url() as url:
        print(asyncio.run(run(url)))
