"""Renewing the locks of a BullMQ queue: ``QueueKeys(name, prefix="bull")``.

BullMQ and EchoMQ share the key layout and the renewal script; only the
default prefix differs (``"bull"`` against ``"emq"``). With
``prefix="bull"`` a Python worker keeps alive the locks of jobs it took from
a queue that Node.js, Python or Go BullMQ workers serve too.

The example plays the part of BullMQ around the manager:

- move-to-active sets the job's lock, ``bull:{queue}:{id}:lock``, to the
  worker's token with the lock duration as TTL;
- each round, the stalled checker puts every active job's id in
  ``bull:{queue}:stalled``; at the next round, an id still there whose lock
  is gone is moved back to wait. A renewal removes the id from that set.

Run it with ``python examples/bullmq_compat.py``; it uses ``REDIS_URL`` or
starts a private server.
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass

import redis

import actors
from actors import QueueKeys
from actors.embedded import server_url

__all__ = ["Result", "main", "run"]


@dataclass(frozen=True)
class Result:
    """What BullMQ would see of the worker's jobs."""

    #: The lock keys the worker set and the manager renewed.
    lock_keys: list[str]
    #: The stalled set's key.
    stalled_key: str
    #: Ids in the stalled set after the checker's round, before renewal.
    stalled_before: set[str]
    #: Ids in the stalled set after the first renewal.
    stalled_after: set[str]
    #: Remaining TTL of each lock after more than one TTL, in milliseconds.
    ttl_after_ms: dict[str, int]
    #: Whether every lock still held the worker's token then.
    held_past_ttl: bool
    #: Ids the manager reported lost.
    lost: list[str]


def _members(client: redis.Redis, key: str) -> set[str]:
    return {m.decode() if isinstance(m, bytes) else m for m in client.smembers(key)}


def run(url: str, *, queue: str = "payments", jobs: int = 3, lock_duration: int = 2000) -> Result:
    """Hold BullMQ jobs for one and a half TTLs while the manager renews them.

    Args:
        url: The server's URL.
        queue: The BullMQ queue's name.
        jobs: Jobs the worker holds.
        lock_duration: Lock TTL, in milliseconds (BullMQ's ``lockDuration``).

    Returns:
        The stalled set before and after a renewal, and the locks' TTLs.

    Raises:
        TimeoutError: No renewal came in time.
    """
    # Step 1: BullMQ's key layout is EchoMQ's with the "bull" prefix.
    keys = QueueKeys(queue, prefix="bull")
    client = redis.Redis.from_url(url, socket_timeout=10, decode_responses=True)
    tokens = {f"{n}": str(uuid.uuid4()) for n in range(1, jobs + 1)}
    renewed: set[str] = set()
    all_renewed = threading.Event()
    lost: list[str] = []

    # Runs on the manager's thread: note, and wake the waiting thread.
    def on_renewed(ids: list[str]) -> None:
        renewed.update(ids)
        if renewed >= tokens.keys():
            all_renewed.set()

    manager = actors.start_link(
        connection=url,
        keys=keys,
        lock_duration=lock_duration,
        on_locks_renewed=on_renewed,
        on_lock_renewal_failed=lost.extend,
    )
    try:
        # Step 2: take the jobs as BullMQ's move-to-active does.
        taken_at = time.monotonic()
        for job_id, token in tokens.items():
            client.set(keys.lock(job_id), token, px=lock_duration)

        # Step 3: a stalled checker's round marks every active job.
        client.sadd(keys.stalled, *tokens)
        stalled_before = _members(client, keys.stalled)

        # Step 4: track the jobs. Their first renewal takes them out of the
        # stalled set: the checker's next round sees them alive.
        for job_id, token in tokens.items():
            actors.track_job(manager, job_id, token)
        if not all_renewed.wait(3 * lock_duration / 1000):
            raise TimeoutError("not every job was renewed within three lock durations")
        stalled_after = _members(client, keys.stalled)

        # Step 5: past one TTL, every lock is still the worker's.
        time.sleep(max(0.0, taken_at + 1.5 * lock_duration / 1000 - time.monotonic()))
        held = all(client.get(keys.lock(job_id)) == token for job_id, token in tokens.items())
        ttls = {job_id: int(client.pttl(keys.lock(job_id))) for job_id in tokens}

        # Step 6: done: untrack, wait until the manager has (an ask answers
        # after the tells before it), then release.
        for job_id in tokens:
            actors.untrack_job(manager, job_id)
        actors.get_active_job_count(manager, timeout=10)
        client.delete(*(keys.lock(job_id) for job_id in tokens))
    finally:
        actors.stop(manager)
        client.close()
    return Result(
        lock_keys=[keys.lock(job_id) for job_id in tokens],
        stalled_key=keys.stalled,
        stalled_before=stalled_before,
        stalled_after=stalled_after,
        ttl_after_ms=ttls,
        held_past_ttl=held,
        lost=list(lost),
    )


def main() -> int:
    """Run on ``REDIS_URL`` or a private server and print what BullMQ would see."""
    with server_url() as url:
        result = run(url)
    print(f"locks: {', '.join(result.lock_keys)}")
    print(
        f"{result.stalled_key}: {sorted(result.stalled_before)} -> {sorted(result.stalled_after)}"
    )
    print(f"held past one TTL: {result.held_past_ttl}; TTLs left (ms): {result.ttl_after_ms}")
    ok = result.held_past_ttl and not result.stalled_after and not result.lost
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
