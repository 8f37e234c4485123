"""A stopped manager tells every watched job, and a replacement keeps every lock alive.

The watching job actors are stood in for by one recording actor; the test
itself plays the supervisor that starts the replacement, tracking every lock
again stamped with when it was taken (``examples/manager_restart.py`` shows
the same done by a keeper actor, and its own test runs it).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pykka

from actors import (
    ExtendLocks,
    LockManager,
    QueueKeys,
    get_tracked_job_ids,
    start_link,
    stop,
    track_job,
)
from tests.support import JobActor, job_ids, take_locks, told, wait_for, watch_locks

if TYPE_CHECKING:
    import redis

    from tests.conftest import Server
    from tests.faults.conftest import FaultRecord

KEYS = QueueKeys("restartable")
LOCK_MS = 1500
JOBS = 20
#: Generous bound on one call, in seconds.
ASK_S = 5.0


def live_managers() -> list[pykka.ActorRef[LockManager]]:
    return [
        ref
        for ref in pykka.ActorRegistry.get_all()
        if issubclass(ref.actor_class, LockManager) and ref.is_alive()
    ]


def test_a_stopped_manager_is_replaced_and_no_held_lock_lapses(
    server: Server, redis_client: redis.Redis, record: FaultRecord
) -> None:
    # Given 20 locks, taken now, tracked by a manager on behalf of a watcher
    watcher = JobActor.start()
    taken_at = time.monotonic_ns() // 1_000_000
    jobs = take_locks(redis_client, KEYS, job_ids(JOBS), LOCK_MS)
    first = start_link(connection=server.url, keys=KEYS, lock_duration=LOCK_MS)
    for job_id, token in jobs.items():
        track_job(first, job_id, token, ts=taken_at, notify=watcher)
    wait_for(lambda: len(get_tracked_job_ids(first, timeout=ASK_S)) == JOBS, ASK_S, "tracking")
    record.fault = "lock manager stopped while jobs live (replaced by their supervisor)"
    record.asserted = "every watcher told manager_stopped once, all locks alive 3x TTL"

    # When the manager is stopped (by an operator, or a stray stop)
    stop(first)

    # Then every watched job is told, once, why nobody renews it now
    lost = [message for _, message in told(watcher, ASK_S)]
    assert sorted((item.job_id, item.token, item.reason) for item in lost) == sorted(
        (job_id, token, "manager_stopped") for job_id, token in jobs.items()
    )

    # And a replacement tracking them again, stamped when each lock was
    # taken and renewing the due ones at once, keeps every lock alive
    second = start_link(connection=server.url, keys=KEYS, lock_duration=LOCK_MS)
    for job_id, token in jobs.items():
        track_job(second, job_id, token, ts=taken_at, notify=watcher)
    second.tell(ExtendLocks())
    seen = watch_locks(redis_client, KEYS, jobs, 3 * LOCK_MS / 1000)
    record.locks_lost = len(seen.missing)
    record.restarts = 1
    record.notes = {"lowest_ttl_ms": seen.lowest_pttl}
    assert seen.lowest_pttl is not None and seen.lowest_pttl > 0
    assert record.locks_lost == 0
    assert live_managers() == [second]
    assert len(told(watcher, ASK_S)) == JOBS
