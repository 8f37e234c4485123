"""One worker serving several queues: one LockManager per queue.

The renewal script takes one queue's key prefix and stalled set, so a manager
renews the locks of one queue. A worker that takes jobs from several queues
starts one manager per queue and tracks each job with its own queue's manager.

Run it with ``python examples/multi_queue.py``; it uses ``REDIS_URL`` or
starts a private server.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING

import redis

import actors
from actors import QueueKeys, Stats
from actors.embedded import server_url

if TYPE_CHECKING:
    from collections.abc import Sequence

    import pykka

    from actors import LockManager

__all__ = ["QueueResult", "Result", "main", "run"]


@dataclass(frozen=True)
class QueueResult:
    """What one queue's manager did."""

    #: The jobs the worker held on this queue.
    job_ids: list[str]
    #: Ids the manager reported renewed, each once per renewal.
    renewed: list[str]
    #: Ids the manager reported lost.
    lost: list[str]
    #: Whether every lock still held the worker's token after more than one TTL.
    held_past_ttl: bool
    #: The manager's counters at the end.
    stats: Stats


@dataclass(frozen=True)
class Result:
    """What a run did, per queue, and how long the locks were held."""

    queues: dict[str, QueueResult]
    #: Milliseconds between taking the locks and checking them.
    held_ms: float


def run(
    url: str,
    *,
    queues: Sequence[str] = ("emails", "images", "reports"),
    jobs_per_queue: int = 3,
    lock_duration: int = 2000,
    renewals: int = 2,
) -> Result:
    """Hold jobs on several queues for 1.5 TTLs and ``renewals`` renewals each.

    Args:
        url: The server's URL.
        queues: The queues' names.
        jobs_per_queue: Jobs the worker takes on each queue.
        lock_duration: Lock TTL, in milliseconds.
        renewals: Renewals to wait for per job.

    Returns:
        Per queue: the renewals and losses the manager reported, and whether
        every lock outlived its TTL.

    Raises:
        TimeoutError: Some lock was not renewed often enough in time.
    """
    client = redis.Redis.from_url(url, socket_timeout=10)
    renewed: dict[str, list[str]] = defaultdict(list)
    lost: dict[str, list[str]] = defaultdict(list)
    guard = threading.Lock()

    # Step 1: one manager per queue. Callbacks run on each manager's own
    # thread, so they only append under a lock.
    managers: dict[str, pykka.ActorRef[LockManager]] = {}
    for name in queues:

        def on_renewed(ids: list[str], name: str = name) -> None:
            with guard:
                renewed[name].extend(ids)

        def on_failed(ids: list[str], name: str = name) -> None:
            with guard:
                lost[name].extend(ids)

        managers[name] = actors.start_link(
            connection=url,
            keys=QueueKeys(name),
            lock_duration=lock_duration,
            on_locks_renewed=on_renewed,
            on_lock_renewal_failed=on_failed,
        )
    try:
        # Step 2: take jobs on every queue (SET NX PX, as move-to-active
        # does) and track each with its queue's manager.
        tokens: dict[tuple[str, str], str] = {}
        taken_at = time.monotonic()
        for name in queues:
            keys = QueueKeys(name)
            for n in range(1, jobs_per_queue + 1):
                job_id, token = f"{name}-{n}", str(uuid.uuid4())
                client.set(keys.lock(job_id), token, nx=True, px=lock_duration)
                actors.track_job(managers[name], job_id, token)
                tokens[name, job_id] = token

        # Step 3: work while the managers renew: for one and a half TTLs, and
        # until every job was renewed often enough, with a deadline.
        hold_until = taken_at + 1.5 * lock_duration / 1000
        deadline = taken_at + (renewals + 4) * lock_duration / 1000
        while True:
            with guard:
                counts = {key: renewed[key[0]].count(key[1]) for key in tokens}
            if min(counts.values()) >= renewals and time.monotonic() >= hold_until:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"renewals per job after the deadline: {counts}")
            time.sleep(lock_duration / 20_000)
        held_ms = (time.monotonic() - taken_at) * 1000

        # Step 4: each lock still holds its token, although a TTL has passed.
        held = {name: True for name in queues}
        for (name, job_id), token in tokens.items():
            value = client.get(QueueKeys(name).lock(job_id))
            held[name] = held[name] and value == token.encode()

        # Step 5: done: untrack the jobs, then release their locks. The ask
        # answers after the untracks (a mailbox is FIFO), so no tick can
        # find a released lock and report it lost.
        for name, job_id in tokens:
            actors.untrack_job(managers[name], job_id)
        stats = {name: actors.get_stats(manager, timeout=10) for name, manager in managers.items()}
        for name, job_id in tokens:
            client.delete(QueueKeys(name).lock(job_id))
    finally:
        for manager in managers.values():
            actors.stop(manager)
        client.close()

    with guard:
        return Result(
            queues={
                name: QueueResult(
                    job_ids=[job_id for queue, job_id in tokens if queue == name],
                    renewed=list(renewed[name]),
                    lost=list(lost[name]),
                    held_past_ttl=held[name],
                    stats=stats[name],
                )
                for name in queues
            },
            held_ms=held_ms,
        )


def main() -> int:
    """Run on ``REDIS_URL`` or a private server and print each queue's counters."""
    with server_url() as url:
        result = run(url)
    print(f"locks held for {result.held_ms:.0f} ms")
    for name, queue in result.queues.items():
        print(
            f"{name:8} jobs={len(queue.job_ids)} renewed={queue.stats.renewed} "
            f"script_calls={queue.stats.script_calls} lost={queue.lost} "
            f"held_past_ttl={queue.held_past_ttl}"
        )
    ok = all(queue.held_past_ttl and not queue.lost for queue in result.queues.values())
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
