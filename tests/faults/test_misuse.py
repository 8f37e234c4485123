"""What callers and callbacks may do wrong: none of it stops the renewal of other jobs."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

import pytest

from actors import (
    GetActiveJobCount,
    ManagerStopped,
    Timing,
    get_active_job_count,
    get_stats,
    is_tracked,
    start_link,
    stop,
    track_job,
    untrack_job,
)
from actors.embedded import free_port
from tests.faults.conftest import KEYS
from tests.support import Recorder, job_ids, lost_locks, take_locks, wait_for

if TYPE_CHECKING:
    import redis

    from actors import LostLock
    from tests.conftest import Server
    from tests.faults.conftest import FaultRecord

LOCK_MS = 2000
TIMING = Timing(LOCK_MS)
#: Long enough for every job to be due and renewed at least once, in seconds.
ROUND = 3 * TIMING.interval / 1000 + 5


def manager_threads() -> set[str]:
    return {t.name for t in threading.enumerate() if t.name.startswith("LockManager")}


def test_raising_callbacks_are_contained(
    server: Server, redis_client: redis.Redis, record: FaultRecord
) -> None:
    # Given callbacks that record what they get, then raise (SystemExit too)
    reports = Recorder()

    def renewed(ids: list[str]) -> None:
        reports.on_locks_renewed(ids)
        raise RuntimeError("renewed callback broke")

    def failed(lost: list[LostLock]) -> None:
        reports.on_lock_renewal_failed(lost)
        raise SystemExit("failed callback exits")

    jobs = take_locks(redis_client, KEYS, job_ids(10), LOCK_MS)
    manager = start_link(
        connection=server.url,
        keys=KEYS,
        lock_duration=LOCK_MS,
        on_locks_renewed=renewed,
        on_lock_renewal_failed=failed,
    )
    record.fault = "callbacks that raise (SystemExit too)"
    record.asserted = "renewals go on; the lost job reported once; actor answers"

    # When ten jobs with a lock and one without are tracked for two renewals each
    for job_id, token in jobs.items():
        track_job(manager, job_id, token)
    track_job(manager, "ghost", "no-such-lock")
    reports.wait(
        lambda: min(reports.renewed()[job_id] for job_id in jobs) >= 2, 2 * ROUND, "two renewals"
    )

    # Then every lock is alive, the ghost was reported once, the actor answers
    record.locks_lost = len(lost_locks(redis_client, KEYS, jobs))
    record.false_reports = len(reports.lost()) - 1
    assert reports.lost() == ["ghost"]
    assert record.locks_lost == 0
    assert get_active_job_count(manager, timeout=5) == 10
    assert not is_tracked(manager, "ghost", timeout=5)


def test_raising_on_error_is_contained_and_ticks_go_on(record: FaultRecord) -> None:
    # Given a manager whose server is unreachable and whose on_error raises
    errors: list[Exception] = []

    def on_error(exc: Exception) -> None:
        errors.append(exc)
        raise RuntimeError("on_error broke")

    manager = start_link(
        connection=f"redis://127.0.0.1:{free_port()}/0",
        keys=KEYS,
        lock_duration=LOCK_MS,
        on_error=on_error,
    )
    record.fault = "unreachable server, on_error raises"
    record.asserted = "every tick reports; nothing untracked; actor answers"

    # When a job is tracked and three ticks fail
    track_job(manager, "j1", "token")
    wait_for(lambda: len(errors) >= 3, 4 * ROUND, "three failed ticks")

    # Then the job is still tracked and the manager counts the errors
    assert is_tracked(manager, "j1", timeout=5)
    assert get_stats(manager, timeout=5).errors >= 3
    assert get_stats(manager, timeout=5).lost == 0


def test_callback_that_blocks_briefly_delays_queries_but_loses_nothing(
    server: Server, redis_client: redis.Redis, reports: Recorder, record: FaultRecord
) -> None:
    # Given an on_locks_renewed that blocks for 300 ms (a tenth of a lock's margin)
    block_s = 0.3
    rounds: list[float] = []

    def slow(ids: list[str]) -> None:
        rounds.append(time.monotonic())
        time.sleep(block_s)

    jobs = take_locks(redis_client, KEYS, job_ids(10), LOCK_MS)
    manager = start_link(
        connection=server.url, keys=KEYS, lock_duration=LOCK_MS, on_locks_renewed=slow
    )
    record.fault = "callback blocks 300 ms"
    record.asserted = "locks renewed through 3 rounds; asks wait at most the block"

    # When the jobs are tracked for three renewing ticks, asking all along
    for job_id, token in jobs.items():
        track_job(manager, job_id, token)
    slowest = 0.0
    deadline = time.monotonic() + 3 * ROUND
    while len(rounds) < 3:
        assert time.monotonic() < deadline, "three renewing ticks did not happen"
        asked = time.monotonic()
        assert get_active_job_count(manager, timeout=5) == 10
        slowest = max(slowest, time.monotonic() - asked)
        time.sleep(0.02)

    # Then no lock was lost, and no ask waited much longer than one block
    record.locks_lost = len(lost_locks(redis_client, KEYS, jobs))
    record.notes = {"slowest_ask_s": round(slowest, 3)}
    assert record.locks_lost == 0
    assert get_stats(manager, timeout=5).lost == 0
    assert slowest < block_s + 1.0


#: What is no message at all: refused at the caller.
NOT_MESSAGES: list[object] = [
    object(),
    "extend_locks",
    42,
    None,
    {"command": "track", "job_id": "x"},
]


def test_garbage_messages_are_dropped_and_renewal_goes_on(
    server: Server, redis_client: redis.Redis, reports: Recorder, record: FaultRecord
) -> None:
    # Given a manager renewing ten jobs
    jobs = take_locks(redis_client, KEYS, job_ids(10), LOCK_MS)
    manager = start_link(
        connection=server.url, keys=KEYS, lock_duration=LOCK_MS, **reports.callbacks()
    )
    for job_id, token in jobs.items():
        track_job(manager, job_id, token)
    record.fault = "garbage messages (tell and ask)"
    record.asserted = "non-messages refused at the caller; tracked set unchanged; renewals go on"

    # When every kind of garbage is told and asked
    for thing in NOT_MESSAGES:
        with pytest.raises(TypeError):
            manager.tell(thing)
        with pytest.raises(TypeError):
            manager.ask(thing, timeout=5)

    # Then the manager still tracks exactly the ten jobs and renews them
    since = time.monotonic()
    assert manager.ask(GetActiveJobCount(), timeout=5) == 10
    reports.wait_renewed(jobs, ROUND, since=since)
    record.locks_lost = len(lost_locks(redis_client, KEYS, jobs))
    assert record.locks_lost == 0
    assert manager.is_alive()


def test_tracking_after_stop_is_ignored_and_nothing_is_left_running(
    server: Server, redis_client: redis.Redis, record: FaultRecord
) -> None:
    # Given a manager that tracked a job and was stopped
    before = manager_threads()
    jobs = take_locks(redis_client, KEYS, job_ids(1), LOCK_MS)
    manager = start_link(connection=server.url, keys=KEYS, lock_duration=LOCK_MS)
    for job_id, token in jobs.items():
        track_job(manager, job_id, token)
    assert get_active_job_count(manager, timeout=5) == 1
    stop(manager)
    record.fault = "track/untrack/stop after stop"
    record.asserted = "tells ignored, asks raise ManagerStopped, no thread or renewal left"

    # When a caller keeps telling it things and stops it again
    track_job(manager, "late", "token")
    untrack_job(manager, "late")
    stop(manager)

    # Then asks fail clearly, no manager thread is left, and the lock is no longer renewed
    with pytest.raises(ManagerStopped, match="is stopped"):
        get_active_job_count(manager, timeout=5)
    assert manager_threads() == before
    job_id = next(iter(jobs))
    redis_client.pexpire(KEYS.lock(job_id), LOCK_MS)
    time.sleep(2 * TIMING.interval / 1000)
    assert redis_client.pttl(KEYS.lock(job_id)) <= LOCK_MS - TIMING.interval
