"""Tracking a job again, with the same token or a new one, and untracking by token."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

import redis

from actors import (
    ExtendLocks,
    LockLost,
    QueueKeys,
    get_stats,
    get_tracked_job_ids,
    is_tracked,
    track_job,
    untrack_job,
)
from tests.support import (
    INTERVAL_S,
    TTL,
    Inbox,
    ManualClock,
    Recorder,
    delivered,
    manual_timer,
    settle,
    start_short,
    take_locks,
    tick,
    wait_for,
    watch_locks,
)

if TYPE_CHECKING:
    import redis


KEYS = QueueKeys("tracking")


def test_a_burst_of_manual_ticks_leaves_the_timer_alone(engine_client: redis.Redis) -> None:
    # A "renew now" leaves the timer's grid where it is.
    manager = start_short(engine_client, KEYS)
    tokens = take_locks(engine_client, KEYS, ["a"], TTL)
    track_job(manager, "a", tokens["a"])
    ticks_before = get_stats(manager).ticks

    stop_asking = threading.Event()

    def ask_renew_now() -> None:
        while not stop_asking.is_set():
            manager.ask(ExtendLocks())

    asker = threading.Thread(target=ask_renew_now)
    asker.start()
    try:
        seen = watch_locks(engine_client, KEYS, tokens, seconds=5 * TTL / 1000, every=0.02)
    finally:
        stop_asking.set()
        asker.join()
    assert seen.missing == set()
    assert seen.lowest_pttl is not None and seen.lowest_pttl > 0
    assert get_stats(manager).ticks > ticks_before


def test_tracking_again_with_the_same_token_never_delays_renewal(
    engine_client: redis.Redis,
) -> None:
    # A progress hook re-tracking every 60 ms must not keep the job "fresh"
    # forever, so that its lock expires with no renewal and no report.
    manager = start_short(engine_client, KEYS)
    tokens = take_locks(engine_client, KEYS, ["a"], TTL)
    track_job(manager, "a", tokens["a"])
    deadline = time.monotonic() + 5 * TTL / 1000
    lowest = TTL
    while time.monotonic() < deadline:
        track_job(manager, "a", tokens["a"])
        lowest = min(lowest, int(engine_client.pttl(KEYS.lock("a"))))
        time.sleep(0.06)
    assert lowest > 0
    assert engine_client.get(KEYS.lock("a")) == tokens["a"].encode()


def test_a_new_token_is_a_fresh_lock(redis_client: redis.Redis) -> None:
    recorder = Recorder()
    manager = start_short(redis_client, KEYS, **recorder.callbacks())
    old = take_locks(redis_client, KEYS, ["a"], TTL)["a"]
    track_job(manager, "a", old)
    redis_client.set(KEYS.lock("a"), "new-token", px=TTL)
    track_job(manager, "a", "new-token")
    seen = watch_locks(redis_client, KEYS, {"a": "new-token"}, seconds=3 * TTL / 1000)
    assert seen.missing == set()
    assert recorder.lost() == []


def test_untracking_an_old_lock_by_its_token_leaves_the_new_one_tracked(
    redis_client: redis.Redis,
) -> None:
    # A lease (or a worker) releasing its old lock must not untrack the job's
    # newer lock, taken since with another token.
    manager = start_short(redis_client, KEYS)
    track_job(manager, "a", "old-token")
    redis_client.set(KEYS.lock("a"), "new-token", px=TTL)
    track_job(manager, "a", "new-token")
    untrack_job(manager, "a", token="old-token", wait=True)
    assert is_tracked(manager, "a")
    seen = watch_locks(redis_client, KEYS, {"a": "new-token"}, seconds=3 * TTL / 1000)
    assert seen.missing == set()
    untrack_job(manager, "a", token="new-token", wait=True)
    assert not is_tracked(manager, "a")


def test_tracking_again_with_the_same_token_keeps_the_notify_target(
    redis_client: redis.Redis,
) -> None:
    """With a manager ``max_hold``, re-tracking with the same token keeps the job's notify target.

    A progress hook that re-tracks must not unsubscribe the lease or job actor
    that asked to hear of a loss: the lock is lost, and its holder is told.
    """
    tokens = take_locks(redis_client, KEYS, ["a"], TTL)
    inbox = Inbox()
    manager = start_short(redis_client, KEYS, max_hold=600_000)
    track_job(manager, "a", tokens["a"], notify=inbox)
    track_job(manager, "a", tokens["a"])  # a progress hook
    settle(manager)
    redis_client.set(KEYS.lock("a"), "somebody-else")
    wait_for(lambda: not is_tracked(manager, "a"), 20 * INTERVAL_S, "the loss of 'a'")
    delivered(manager)
    assert inbox.got == [LockLost("a", tokens["a"], "stolen")]


def test_tracking_again_with_the_same_token_keeps_the_max_hold_deadline(
    redis_client: redis.Redis,
) -> None:
    """Re-tracking with the same token keeps the ``max_hold`` deadline, so the hold still ends.

    The stamp is kept (as the contract asks), and so is the hold deadline: a
    progress hook that re-tracks more often than ``max_hold`` does not keep a job
    renewed for ever.
    """
    clock, timers = ManualClock(), manual_timer()
    lock_duration, max_hold = 30_000, 1_000
    tokens = take_locks(redis_client, KEYS, ["a"], lock_duration)
    recorder = Recorder()
    manager = recorder.start(
        redis_client,
        KEYS,
        lock_duration=lock_duration,
        max_hold=max_hold,
        clock=clock,
        timer=timers,
    )
    track_job(manager, "a", tokens["a"])
    settle(manager)
    clock.advance(max_hold * 6 // 10)
    track_job(manager, "a", tokens["a"])  # a progress hook
    settle(manager)
    clock.advance(max_hold * 6 // 10)  # 1.2 x max_hold since the lock was taken
    tick(manager)
    assert [(lost.job_id, lost.reason) for lost in recorder.lost()] == [("a", "max_hold")]
    assert get_tracked_job_ids(manager) == []
