"""Several holders of one lock, on each engine's real server.

A worker tracks its job plainly, the job's code holds a lease for one phase,
a job actor watches with ``notify``: each is a claim of its own, with its own
terms. Leaving, untracking or a deadline ends the one claim; the lock is
renewed while any claim remains; each target watching a lost lock is told
once, however often it tracks the lock again.

Locks are ``TTL`` ms (renew window ``TTL // 2``, interval ``TTL // 4``); a
watched lock is checked at every tick, so a loss is told within one interval.
Every wait polls with a deadline that is a multiple of those durations.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import TYPE_CHECKING, Any

from actors import (
    LockLost,
    QueueKeys,
    aio,
    is_tracked,
    lease,
    stop,
    track_job,
    untrack_job,
)
from tests.support import (
    Inbox,
    Recorder,
    delivered,
    settle,
    start_short,
    steal,
    take_locks,
    wait_for,
    wait_ticks,
    watch_locks,
)

if TYPE_CHECKING:
    import redis


KEYS = QueueKeys("holders")
TTL = 600  # ms: renew window 300 ms, interval 150 ms
INTERVAL_S = TTL / 4 / 1000
#: The most a loss may take to be told on a loaded machine: ten intervals where one is the rule.
LEARN_S = 10 * INTERVAL_S
#: Long enough for a lock nobody renews to expire, with a margin.
WATCH_S = 2.5 * TTL / 1000


# -- 1. leaving a lease ends the lease's claim alone -----------------------------


def test_leaving_a_lease_keeps_the_workers_renewal(engine_client: redis.Redis) -> None:
    # Given a worker that tracks its job, and the job holding a lease for one phase
    recorder = Recorder()
    manager = start_short(
        engine_client, KEYS, own_client=True, lock_duration=TTL, **recorder.callbacks()
    )
    tokens = take_locks(engine_client, KEYS, ["j2"], TTL)
    track_job(manager, "j2", tokens["j2"])
    with lease(manager, "j2", tokens["j2"]):
        wait_ticks(manager, 2, timeout=LEARN_S)
    # when the phase ends and the job goes on working
    seen = watch_locks(engine_client, KEYS, tokens, WATCH_S)
    # then the worker's claim still renews the lock, and nothing was lost
    assert seen.missing == set(), "leaving the lease ended the worker's renewal"
    assert is_tracked(manager, "j2")
    assert recorder.lost() == []


def test_leaving_a_lease_keeps_a_job_actors_watch(engine_client: redis.Redis) -> None:
    # Given a job actor watching the lock beside a lease
    manager = start_short(engine_client, KEYS, own_client=True, lock_duration=TTL)
    tokens = take_locks(engine_client, KEYS, ["j2"], TTL)
    actor = Inbox()
    track_job(manager, "j2", tokens["j2"], notify=actor)
    with lease(manager, "j2", tokens["j2"]) as held:
        settle(manager)
    assert not held.lost
    # when the lease is left, and the lock is later taken by another worker
    assert watch_locks(engine_client, KEYS, tokens, WATCH_S).missing == set()
    steal(engine_client, KEYS, "j2", TTL)
    # then the actor, still watching, is told once
    wait_for(lambda: actor.got, LEARN_S, "the actor to hear of the theft")
    wait_ticks(manager, 2, timeout=LEARN_S)
    delivered(manager)
    assert actor.got == [LockLost("j2", tokens["j2"], "stolen")]


# -- 2. another holder's untrack never blinds a lease ----------------------------


def test_a_workers_untrack_leaves_the_lease_watching(engine_client: redis.Redis) -> None:
    # Given a worker that tracks, and a lease with a watchdog thread waiting on it
    manager = start_short(engine_client, KEYS, own_client=True, lock_duration=TTL)
    tokens = take_locks(engine_client, KEYS, ["j1"], TTL)
    track_job(manager, "j1", tokens["j1"])
    woke: list[bool] = []
    with lease(manager, "j1", tokens["j1"]) as held:
        watchdog = threading.Thread(target=lambda: woke.append(held.wait(WATCH_S + LEARN_S)))
        watchdog.start()
        # when the worker's own path untracks by token, and the lock is then stolen
        untrack_job(manager, "j1", token=tokens["j1"], wait=True)
        assert is_tracked(manager, "j1"), "the worker's untrack ended the lease's claim"
        assert watch_locks(engine_client, KEYS, tokens, WATCH_S).missing == set()
        stolen_at = time.monotonic()
        steal(engine_client, KEYS, "j1", TTL)
        watchdog.join(LEARN_S)
        # then the lease hears of it, and its watchdog wakes
        assert woke == [True]
        assert time.monotonic() - stolen_at < LEARN_S
        assert held.reason == "stolen"


def test_every_wait_wakes_when_the_manager_stops(engine_client: redis.Redis) -> None:
    # Given a lease whose worker untracked the job, waited on by a thread and a task
    manager = start_short(engine_client, KEYS, own_client=True, lock_duration=TTL)
    tokens = take_locks(engine_client, KEYS, ["j1"], TTL)
    track_job(manager, "j1", tokens["j1"])
    woke: list[bool] = []
    with lease(manager, "j1", tokens["j1"]) as held:
        untrack_job(manager, "j1", token=tokens["j1"], wait=True)
        watchdog = threading.Thread(target=lambda: woke.append(held.wait(LEARN_S)))
        watchdog.start()

        async def waits() -> bool:
            return await held.wait_async(LEARN_S)

        task = threading.Thread(target=lambda: woke.append(asyncio.run(waits())))
        task.start()
        # when the manager stops
        wait_ticks(manager, 1, timeout=LEARN_S)
        stopped_at = time.monotonic()
        stop(manager)
        watchdog.join(LEARN_S)
        task.join(LEARN_S)
        # then both wake at once, without anyone reading ``lost``
        assert woke == [True, True]
        assert time.monotonic() - stopped_at < LEARN_S / 2
        assert held.reason == "manager_stopped"


# -- 3. told once per lost lock, however often it is tracked again ---------------


def test_a_lost_lock_tracked_again_is_told_and_reported_once(engine_client: redis.Redis) -> None:
    # Given an actor that tracks its job, whose lock is then stolen
    recorder = Recorder()
    manager = start_short(
        engine_client, KEYS, own_client=True, lock_duration=TTL, **recorder.callbacks()
    )
    tokens = take_locks(engine_client, KEYS, ["j1"], TTL)
    actor, latecomer = Inbox(), Inbox()
    track_job(manager, "j1", tokens["j1"], notify=actor)
    steal(engine_client, KEYS, "j1", TTL)
    wait_for(lambda: actor.got, LEARN_S, "the actor to hear of the theft")
    # when its progress hook tracks the same lock four more times
    for _ in range(4):
        track_job(manager, "j1", tokens["j1"], notify=actor)
        track_job(manager, "j1", tokens["j1"])
    track_job(manager, "j1", tokens["j1"], notify=latecomer)
    wait_ticks(manager, 3, timeout=LEARN_S)
    delivered(manager)
    # then the actor was told once, the callback reported it once, and it is not renewed
    lost = LockLost("j1", tokens["j1"], "stolen")
    assert actor.got == [lost]
    assert [(item.job_id, item.token, item.reason) for item in recorder.lost()] == [
        ("j1", tokens["j1"], "stolen")
    ]
    assert not is_tracked(manager, "j1")
    # and a target that asks only after the loss hears of it at once, once
    assert latecomer.got == [lost]


def test_a_target_that_tracks_again_in_its_tell_is_told_once(
    engine_client: redis.Redis,
) -> None:
    # Given a target whose tell tracks its lock again, as a restarting job might
    manager = start_short(engine_client, KEYS, own_client=True, lock_duration=TTL)
    tokens = take_locks(engine_client, KEYS, ["j1"], TTL)

    class TracksAgain(Inbox):
        def tell(self, message: Any) -> None:
            super().tell(message)
            track_job(manager, "j1", tokens["j1"], notify=self)

    target = TracksAgain()
    track_job(manager, "j1", tokens["j1"], notify=target)
    # when its lock expires
    engine_client.delete(KEYS.lock("j1"))
    wait_for(lambda: target.got, LEARN_S, "the target to hear of the expiry")
    wait_ticks(manager, 4, timeout=LEARN_S)
    delivered(manager)
    # then it was told once, not at every tick
    assert target.got == [LockLost("j1", tokens["j1"], "expired")]


# -- 4. each claim keeps its own max_hold ---------------------------------------


def test_a_leases_max_hold_applies_beside_a_longer_cap(engine_client: redis.Redis) -> None:
    # Given a manager capped at a minute, and a worker that tracked first
    recorder = Recorder()
    manager = start_short(
        engine_client,
        KEYS,
        own_client=True,
        lock_duration=TTL,
        **recorder.callbacks(),
        max_hold=60_000,
    )
    tokens = take_locks(engine_client, KEYS, ["j"], TTL)
    track_job(manager, "j", tokens["j"])
    # when a lease holds the lock with a cap of its own
    with lease(manager, "j", tokens["j"], max_hold=TTL // 2) as held:
        # then the lease is lost at its own deadline
        assert held.wait(TTL / 2000 + LEARN_S)
        assert held.reason == "max_hold"
        # and the worker's claim still renews the lock
        assert watch_locks(engine_client, KEYS, tokens, WATCH_S).missing == set()
        assert is_tracked(manager, "j")
    assert recorder.lost() == []


def test_a_lease_without_a_cap_outlives_another_claims_deadline(
    engine_client: redis.Redis,
) -> None:
    # Given a worker that tracks with a short cap, and a lease without one
    recorder = Recorder()
    manager = start_short(
        engine_client, KEYS, own_client=True, lock_duration=TTL, **recorder.callbacks()
    )
    tokens = take_locks(engine_client, KEYS, ["j"], TTL)
    track_job(manager, "j", tokens["j"], max_hold=TTL // 2)
    with lease(manager, "j", tokens["j"]) as held:
        # when the worker's deadline passes
        seen = watch_locks(engine_client, KEYS, tokens, WATCH_S)
        # then the lease keeps its lock renewed, and nobody lost anything
        assert seen.missing == set(), "the lease inherited the worker's deadline"
        assert not held.lost
    assert recorder.lost() == []
    # and with the lease left, no claim is left: nothing renews the lock
    assert not is_tracked(manager, "j")


# -- a target ends its own claim through the helpers --------------------------------


def test_a_target_ends_its_own_claim_with_untrack_job_notify(engine_client: redis.Redis) -> None:
    manager = start_short(engine_client, KEYS, own_client=True, lock_duration=TTL)
    token = take_locks(engine_client, KEYS, ["j9"], TTL)["j9"]
    watcher = Inbox()
    track_job(manager, "j9", token)
    track_job(manager, "j9", token, notify=watcher)

    # When the watcher ends its own claim (synchronously, then through aio),
    untrack_job(manager, "j9", token=token, notify=watcher, wait=True)
    # then the worker's plain claim keeps the lock renewed,
    assert is_tracked(manager, "j9")
    track_job(manager, "j9", token, notify=watcher)

    async def untrack_the_watcher() -> None:
        await aio.untrack_job(manager, "j9", token=token, notify=watcher)

    asyncio.run(untrack_the_watcher())
    assert is_tracked(manager, "j9")
    # and the worker's own untrack ends it, nobody being told.
    untrack_job(manager, "j9", token=token, wait=True)
    assert not is_tracked(manager, "j9")
    assert watcher.got == []
    stop(manager)
