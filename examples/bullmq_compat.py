"""Renewing the locks of a BullMQ queue: ``QueueKeys(name, prefix="bull")``.

BullMQ and EchoMQ share the key layout and the renewal script; only the
default prefix differs (``"bull"`` against ``"emq"``). With ``prefix="bull"``
a Python worker keeps alive the locks of jobs it took from a queue that
Node.js, Python or Go BullMQ workers serve too.

The example plays BullMQ's part around the manager: move-to-active sets the
job's lock, ``bull:{queue}:{id}:lock``, to the worker's token with the lock
duration as TTL; each round, the stalled checker puts every active job's id in
``bull:{queue}:stalled``, and moves back to wait any id still there at its next
round whose lock is gone. A renewal takes the id out of that set.

Run it with ``python examples/bullmq_compat.py``; it uses ``REDIS_URL`` or
starts a private server.
"""

from __future__ import annotations

import threading
import time
import uuid

import redis

import actors
from actors.embedded import server_url

#: Lock TTL, in milliseconds (BullMQ's ``lockDuration``): short, so the example ends in seconds.
LOCK_MS = 1500


def main() -> int:
    """Hold three BullMQ jobs for one and a half TTLs while the manager renews them."""
    # Step 1: BullMQ's key layout is EchoMQ's with the "bull" prefix.
    keys = actors.QueueKeys("payments", prefix="bull")
    tokens = {str(n): str(uuid.uuid4()) for n in (1, 2, 3)}
    lost: list[str] = []
    renewed: set[str] = set()
    all_renewed = threading.Event()

    def on_renewed(ids: list[str]) -> None:
        # On the manager's thread: note, and wake the waiting one.
        renewed.update(ids)
        if renewed >= tokens.keys():
            all_renewed.set()

    with server_url() as url:
        client = redis.Redis.from_url(url, socket_timeout=5, decode_responses=True)
        manager = actors.start_link(
            connection=url,
            keys=keys,
            lock_duration=LOCK_MS,
            on_locks_renewed=on_renewed,
            on_lock_renewal_failed=lost.extend,
        )
        try:
            # Step 2: take the jobs as BullMQ's move-to-active does.
            taken_at = time.monotonic()
            for job_id, token in tokens.items():
                client.set(keys.lock(job_id), token, px=LOCK_MS)

            # Step 3: a stalled checker's round marks every active job.
            client.sadd(keys.stalled, *tokens)
            print(f"{keys.stalled} before renewal: {sorted(client.smembers(keys.stalled))}")

            # Step 4: track the jobs. Their first renewal takes them out of the
            # stalled set: the checker's next round sees them alive. Each job is
            # renewed within two ticks of its threshold; allow a TTL.
            for job_id, token in tokens.items():
                actors.track_job(manager, job_id, token)
            all_renewed.wait(2 * LOCK_MS / 1000)
            print(f"{keys.stalled} after renewal: {sorted(client.smembers(keys.stalled))}")
            stalled = client.scard(keys.stalled)

            # Step 5: past one and a half TTLs, every lock is still the worker's.
            time.sleep(max(0.0, taken_at + 1.5 * LOCK_MS / 1000 - time.monotonic()))
            held = [
                job_id for job_id, token in tokens.items() if client.get(keys.lock(job_id)) == token
            ]
            for job_id in held:
                print(f"{keys.lock(job_id)}: held, {client.pttl(keys.lock(job_id))} ms left")

            # Step 6: done: untrack, wait until the manager has, then release.
            for job_id in tokens:
                actors.untrack_job(manager, job_id, wait=True)
            client.delete(*(keys.lock(job_id) for job_id in tokens))
        finally:
            actors.stop(manager)
            client.close()
    print(f"{len(held)} of {len(tokens)} locks held past one TTL; lost: {lost}")
    return 0 if len(held) == len(tokens) and not stalled and not lost else 1


if __name__ == "__main__":
    raise SystemExit(main())
