"""A supervisor restarts a stopped or failed manager and keeps every live job's lock.

The supervisor is the one in ``examples/manager_restart.py``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pykka
import pytest
import redis

from actors import LockManager, get_active_job_count, get_tracked_job_ids, stop
from actors.schedule import Timing
from examples.manager_restart import LockSupervisor, WatchedLockManager
from tests.faults.conftest import KEYS, dead_locks, min_pttl, seed_locks, wait_until

if TYPE_CHECKING:
    from collections.abc import Iterator

    from tests.conftest import Server
    from tests.faults.conftest import FaultRecord

LOCK_MS = 1500
TIMING = Timing(LOCK_MS)
JOBS = 20


@dataclass(frozen=True, slots=True)
class Crash:
    """Makes a CrashingLockManager fail as a bug in the actor would."""


class CrashingLockManager(WatchedLockManager):
    def on_receive(self, message: Any) -> Any:
        if isinstance(message, Crash):
            raise RuntimeError("lock manager crashed")
        return super().on_receive(message)


@pytest.fixture
def client(server: Server, redis_client: redis.Redis) -> Iterator[redis.Redis]:
    conn = redis.Redis.from_url(server.url, socket_timeout=0.25, socket_connect_timeout=0.25)
    yield conn
    conn.close()


def kill_by_stop(manager: pykka.ActorRef[LockManager]) -> None:
    stop(manager)


def kill_by_crash(manager: pykka.ActorRef[LockManager]) -> None:
    manager.tell(Crash())


@pytest.mark.parametrize("how", ["stopped", "crashed"])
def test_supervisor_restarts_the_manager_and_no_live_job_loses_its_lock(
    how: str, client: redis.Redis, redis_client: redis.Redis, record: FaultRecord
) -> None:
    # Given a supervisor running 20 job actors whose locks a manager renews
    supervisor = LockSupervisor.start(
        connection=client, keys=KEYS, lock_duration=LOCK_MS, manager_class=CrashingLockManager
    )
    boss = supervisor.proxy()
    try:
        jobs = seed_locks(redis_client, JOBS, LOCK_MS)
        for job_id, token in jobs.items():
            boss.start_job(job_id, token).get(timeout=5)
        first = boss.manager().get(timeout=5)
        assert first is not None
        wait_until(lambda: get_active_job_count(first, timeout=5) == JOBS, 5, "tracking")
        record.fault = f"lock manager {how} while jobs live (supervised)"
        record.asserted = "restarted once, every live job tracked again, all locks alive 3x TTL"

        # When the manager ends: stopped by someone, or failing on a bug
        {"stopped": kill_by_stop, "crashed": kill_by_crash}[how](first)

        # Then the supervisor starts a new manager that tracks every live job
        wait_until(lambda: boss.restarts().get(timeout=5) == 1, 5, "the restart")
        second = boss.manager().get(timeout=5)
        assert second is not None
        assert second.actor_urn != first.actor_urn
        assert not first.is_alive()
        assert sorted(get_tracked_job_ids(second, timeout=5)) == sorted(jobs)

        # And for three lock lifetimes every lock stays alive
        lowest = LOCK_MS
        watched = time.monotonic()
        while time.monotonic() - watched < 3 * LOCK_MS / 1000:
            lowest = min(lowest, min_pttl(redis_client, jobs))
            time.sleep(0.05)
        record.locks_lost = len(dead_locks(redis_client, jobs))
        record.restarts = boss.restarts().get(timeout=5)
        record.notes = {"lowest_ttl_ms": lowest}
        assert lowest > 0
        assert record.locks_lost == 0
        assert record.restarts == 1
    finally:
        supervisor.stop()


def test_supervisor_stopping_stops_its_manager_without_a_restart(
    client: redis.Redis, redis_client: redis.Redis
) -> None:
    # Given a supervisor with one job
    supervisor = LockSupervisor.start(connection=client, keys=KEYS, lock_duration=LOCK_MS)
    jobs = seed_locks(redis_client, 1, LOCK_MS)
    for job_id, token in jobs.items():
        supervisor.proxy().start_job(job_id, token).get(timeout=5)
    manager = supervisor.proxy().manager().get(timeout=5)
    assert manager is not None

    # When the supervisor itself stops
    supervisor.stop()

    # Then its manager is gone and no new one was started
    assert not manager.is_alive()
    assert not [
        ref
        for ref in pykka.ActorRegistry.get_all()
        if issubclass(ref.actor_class, LockManager) and ref.is_alive()
    ]
