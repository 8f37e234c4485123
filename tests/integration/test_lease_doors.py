"""Leases at their edges: leaving twice or unentered, two leases of one lock, odd timeouts."""

from __future__ import annotations

import asyncio
import math
import threading
import time

import pykka
import pytest
import redis
import redis.asyncio

import actors
from actors import QueueKeys, aio, is_tracked, lease, start_link, track_job
from tests.support import (
    TTL,
    WATCH_S,
    FlakyClock,
    LockTable,
    ManualTimers,
    settle,
    start_short,
    take_locks,
    wait_for,
    watch_locks,
)

KEYS = QueueKeys("lease-doors")


def test_a_lease_is_told_when_its_job_is_leased_again_with_a_new_token(
    redis_client: redis.Redis,
) -> None:
    """A second lease of the job with a new token leaves the first one told that its lock is stolen.

    A stalled job handed back to the worker with a fresh token while its first
    run goes on: the first lease's lock now holds another token, and the first
    lease hears that it is stolen, so its job does not go on as if it held it.
    """
    manager = start_short(redis_client, KEYS, own_client=True)
    first_token = take_locks(redis_client, KEYS, ["j"], TTL)["j"]
    with lease(manager, "j", first_token) as first:
        # The job is taken again (a new token on its lock), and leased again.
        redis_client.set(KEYS.lock("j"), "second-token", px=TTL)
        with lease(manager, "j", "second-token") as second:
            lost = first.wait(WATCH_S)
            assert not second.lost
        assert lost, "the first lease's lock holds another token, yet it was never told"
        assert first.reason == "stolen"


def test_leaving_one_of_two_leases_on_one_lock_keeps_the_other_renewed(
    redis_client: redis.Redis,
) -> None:
    """Leaving one of two leases of the same (job, token) keeps the lock renewed under the other.

    Each lease is its own claim: leaving the first removes only the first's,
    and the second lease's lock is renewed for as long as it is held.
    """
    manager = start_short(redis_client, KEYS, own_client=True)
    tokens = take_locks(redis_client, KEYS, ["j"], TTL)
    with lease(manager, "j", tokens["j"]) as held:
        with lease(manager, "j", tokens["j"]):
            pass  # another lease of the same lock, entered and left meanwhile
        seen = watch_locks(redis_client, KEYS, tokens, WATCH_S)
        assert is_tracked(manager, "j"), "leaving the other lease ended this one's claim"
    assert seen.missing == set(), "the held lease's lock expired"
    assert not held.lost


def test_leaving_a_lease_never_entered_leaves_the_job_tracked(redis_client: redis.Redis) -> None:
    """``__exit__`` of a lease never entered untracks nothing.

    A lease built but never entered (an ``ExitStack`` that registered the exit
    before an ``__enter__`` that raised, say) holds no claim: its exit leaves a
    job tracked by somebody else with the same token renewed.
    """
    manager = start_short(redis_client, KEYS, own_client=True)
    tokens = take_locks(redis_client, KEYS, ["j"], TTL)
    track_job(manager, "j", tokens["j"])
    never_entered = lease(manager, "j", tokens["j"])
    never_entered.__exit__(None, None, None)
    assert is_tracked(manager, "j"), "a lease never entered untracked the job on exit"


def test_leaving_a_lease_twice_leaves_the_jobs_next_lock_tracked(redis_client: redis.Redis) -> None:
    """A second ``__exit__`` of a left lease untracks nothing.

    After the lease is left, the job is tracked again with the same token
    (a progress hook, or a new lease); leaving the old lease once more sends
    nothing: that lock is still renewed.
    """
    manager = start_short(redis_client, KEYS, own_client=True)
    tokens = take_locks(redis_client, KEYS, ["j"], TTL)
    held = lease(manager, "j", tokens["j"])
    with held:
        pass
    track_job(manager, "j", tokens["j"])
    held.__exit__(None, None, None)
    assert is_tracked(manager, "j"), "leaving a left lease again untracked the job's lock"


def test_wait_with_a_nan_timeout_never_spins_a_core(
    redis_client: redis.Redis,
) -> None:
    """``Lease.wait(float("nan"))`` returns or refuses; it never spins a core.

    A ``nan`` timeout is refused (``ValueError``) or returns at once, as
    ``threading.Event.wait`` does; a waiting thread uses next to no CPU.
    """
    manager = start_short(redis_client, KEYS, own_client=True)
    tokens = take_locks(redis_client, KEYS, ["j"], TTL)
    held = lease(manager, "j", tokens["j"]).__enter__()
    spent: list[float] = []
    outcome: list[object] = []

    def watchdog() -> None:
        started = time.thread_time()
        try:
            outcome.append(held.wait(math.nan))
        except ValueError as error:
            outcome.append(error)
        spent.append(time.thread_time() - started)

    thread = threading.Thread(target=watchdog, daemon=True)
    thread.start()
    held_for = WATCH_S
    thread.join(held_for)
    held.__exit__(None, None, None)
    assert outcome, "wait(nan) never returned"
    # A waiting thread uses next to no CPU; a spinning one uses all it gets.
    assert spent[0] < held_for / 4, f"wait(nan) burned {spent[0]:.2f} s of CPU"


def test_aio_stop_from_a_callback_returns_as_stop_does(
    redis_client: redis.Redis,
) -> None:
    """``aio.stop`` awaited in a callback returns, as ``stop`` does.

    A callback runs on the manager's delivery thread: from there ``aio.stop``
    waits for the manager's own thread, not for the delivery thread, as
    ``actors.stop`` does: waiting for that one would wait for itself.
    """
    outcome: list[object] = []
    asked = threading.Event()

    def callback(_ids: list[str]) -> None:
        if asked.is_set():
            return
        asked.set()
        try:
            asyncio.run(aio.stop(manager, timeout=WATCH_S))
            outcome.append("stopped")
        except pykka.Timeout as error:
            outcome.append(error)

    manager = start_short(redis_client, KEYS, own_client=True, on_locks_renewed=callback)
    tokens = take_locks(redis_client, KEYS, ["j"], TTL)
    track_job(manager, "j", tokens["j"])
    wait_for(lambda: outcome, 10 * WATCH_S, "the callback's aio.stop to return")
    assert outcome == ["stopped"]
    wait_for(lambda: not manager.is_alive(), 10 * WATCH_S, "the manager to stop")


def test_a_lease_whose_entry_failed_can_be_entered_again() -> None:
    # Given a manager whose clock raises as a lease's track is stamped
    clock, table = FlakyClock(), LockTable()
    manager = start_link(renewer=table, keys=KEYS, clock=clock, timer=ManualTimers())
    table.held["j"] = "t"
    clock.fail_next = True
    with pytest.raises(RuntimeError, match="clock"), lease(manager, "j", "t"):
        pass  # never reached
    # when the job leases the same lock again
    with lease(manager, "j", "t") as held:
        settle(manager)
        # then it holds it, and the manager renews it
        assert is_tracked(manager, "j")
        assert not held.lost
    assert not is_tracked(manager, "j")
    actors.stop(manager)
