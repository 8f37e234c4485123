"""Stopping managers: from their own callbacks, from each other's, and racing."""

from __future__ import annotations

import asyncio
import threading
from typing import TYPE_CHECKING, Any

import pykka
import pytest

from actors import (
    ExtendLocks,
    QueueKeys,
    aio,
    get_stats,
    is_tracked,
    lease,
    start_link,
    stop,
    track_job,
    untrack_job,
)
from tests.support import ManualClock, take_locks, wait_for
from tests.support.fakes import Inbox, LockTable

if TYPE_CHECKING:
    from collections.abc import Callable

    import redis

    from actors import ManagerRef

TTL = 1000
#: Longest wait for something an idle manager does at once, on a loaded machine.
PROMPT_S = 5.0
#: The timeout a callback's own stop is given: a deadlock shows as its Timeout.
STOP_TIMEOUT_S = 3 * PROMPT_S


def _stop_everything(_: ManagerRef) -> object:
    return pykka.ActorRegistry.stop_all(timeout=STOP_TIMEOUT_S)


def _stop_the_other(other: ManagerRef) -> object:
    return asyncio.run(aio.stop(other, timeout=STOP_TIMEOUT_S))


def _manager_threads(before: set[threading.Thread]) -> list[threading.Thread]:
    return [t for t in set(threading.enumerate()) - before if t.name.startswith("LockManager")]


@pytest.mark.parametrize("stopping", [_stop_everything, _stop_the_other])
def test_managers_whose_callbacks_stop_each_other_all_stop(
    redis_client: redis.Redis, stopping: Callable[[ManagerRef], object]
) -> None:
    # Given two managers whose callbacks run at the same time, and each
    # stops the other (or every actor, with pykka's stop_all)
    before = set(threading.enumerate())
    both_inside = threading.Barrier(2)
    managers: dict[str, ManagerRef] = {}
    outcomes: dict[str, object] = {}

    def on_renewed(name: str, other: str) -> Callable[[list[str]], None]:
        def callback(_: list[str]) -> None:
            if name in outcomes:
                return
            outcomes[name] = None
            try:
                both_inside.wait(PROMPT_S)
                outcomes[name] = stopping(managers[other])
            except Exception as error:
                outcomes[name] = error

        return callback

    for name, other in (("a", "b"), ("b", "a")):
        keys = QueueKeys(f"stop-{name}")
        managers[name] = start_link(
            connection=redis_client,
            keys=keys,
            lock_duration=TTL,
            on_locks_renewed=on_renewed(name, other),
        )
        tokens = take_locks(redis_client, keys, ["j"], TTL)
        track_job(managers[name], "j", tokens["j"], ts=managers[name].clock() - TTL)

    # when both renew (and so call back) at once
    for manager in managers.values():
        manager.tell(ExtendLocks())

    # then neither waited for the other: both stopped, no thread is left
    wait_for(lambda: len(outcomes) == 2 and None not in outcomes.values(), 2 * PROMPT_S, "both")
    assert not any(isinstance(outcome, Exception) for outcome in outcomes.values()), outcomes
    wait_for(lambda: not _manager_threads(before), PROMPT_S, "the managers' threads to end")
    assert not any(manager.is_alive() for manager in managers.values())


def test_of_racing_stops_exactly_one_returns_true(redis_client: redis.Redis) -> None:
    racers = 8
    for _ in range(20):
        # Given a running manager, and several threads that stop it at once
        manager = start_link(connection=redis_client, keys=QueueKeys("race"), lock_duration=TTL)
        start = threading.Barrier(racers)
        returned: list[bool] = []

        def racer(
            by_ref: bool,
            m: ManagerRef = manager,
            s: threading.Barrier = start,
            r: list[bool] = returned,
        ) -> None:
            s.wait(PROMPT_S)
            r.append(m.stop(timeout=PROMPT_S) if by_ref else stop(m, timeout=PROMPT_S))

        # (half through the helper, half through the reference)
        threads = [threading.Thread(target=racer, args=(n % 2 == 0,)) for n in range(racers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(2 * PROMPT_S)

        # then every call returned once it was stopped, and one alone says it stopped it
        assert sorted(returned) == [False] * (racers - 1) + [True]
        assert not manager.is_alive()
        assert stop(manager) is False


def test_a_stop_without_waiting_is_true_for_the_first_call_only(
    redis_client: redis.Redis,
) -> None:
    manager = start_link(connection=redis_client, keys=QueueKeys("race"), lock_duration=TTL)

    first = manager.stop(block=False)
    second = manager.stop(block=False)

    assert (first.get(timeout=PROMPT_S), second.get(timeout=PROMPT_S)) == (True, False)
    assert manager.stop(block=False).get(timeout=PROMPT_S) is False


class _FiredByHand:
    """A timer whose fires the test makes itself (``fire`` puts the timer's own tick)."""

    def __init__(self, fire: Callable[[int], None], _name: str) -> None:
        self.fire = fire
        timers.append(self)

    def arm(self, deadline_ms: int) -> None:
        pass

    def close(self) -> None:
        pass


timers: list[_FiredByHand] = []


class _Job(pykka.ThreadingActor):
    """A job actor that untracks its lock, waiting for the manager, and then releases it."""

    def __init__(self, manager: ManagerRef, table: LockTable, how: str) -> None:
        super().__init__()
        self.manager, self.table, self.how = manager, table, how

    def on_start(self) -> None:
        if self.how == "lease":
            self.lease = lease(self.manager, "j", self.table.held["j"]).__enter__()
        else:
            track_job(self.manager, "j", self.table.held["j"])

    def on_stop(self) -> None:
        if self.how == "lease":
            self.lease.__exit__(None, None, None)
        else:
            untrack_job(self.manager, "j", wait=True, timeout=STOP_TIMEOUT_S)
        del self.table.held["j"]


@pytest.mark.parametrize("how", ["untrack_job", "lease"])
@pytest.mark.parametrize("stopping", ["stop_all", "stop"])
def test_a_callback_stopping_a_job_actor_that_untracks_with_wait_does_not_deadlock(
    how: str, stopping: str
) -> None:
    # Given a job actor whose on_stop untracks with wait=True and then deletes
    # its lock, and a manager whose callback stops that actor, waiting for it
    table = LockTable()
    table.held["j"] = "t"
    clock = ManualClock()
    lost: list[object] = []
    outcome: dict[str, object] = {}
    timers.clear()

    def on_renewed(_: list[str]) -> None:
        if outcome:
            return
        outcome["started"] = True
        try:
            if stopping == "stop_all":
                pykka.ActorRegistry.stop_all(timeout=STOP_TIMEOUT_S)
                # (which stops the manager too, before it returns)
                outcome["manager_alive"] = manager.is_alive()
            else:
                job.stop(timeout=STOP_TIMEOUT_S)
                # and the timer's tick, which jumps the mailbox, put while still in
                # the callback, when the lock is due again
                timers[0].fire(clock.advance(TTL // 2))
            outcome["stopped"] = True
        except Exception as error:
            outcome["stopped"] = error

    manager = start_link(
        renewer=table,
        keys=QueueKeys("stop-job"),
        lock_duration=TTL,
        timer=_FiredByHand,
        clock=clock,
        on_locks_renewed=on_renewed,
        on_lock_renewal_failed=lost.extend,
    )
    try:
        job = _Job.start(manager, table, how)
        wait_for(lambda: table.held and is_tracked(manager, "j"), PROMPT_S, "the job's track")

        # when a tick renews the job's lock and so calls back
        clock.advance(TTL // 2)
        manager.tell(ExtendLocks())

        # then the callback's stop returned: the actor untracked without waiting for it
        wait_for(lambda: "stopped" in outcome, 2 * PROMPT_S, "the callback's stop")
        assert outcome["stopped"] is True, outcome
        assert not job.is_alive()
        if stopping == "stop_all":
            assert outcome["manager_alive"] is False, "stop_all returned before the manager stopped"
        if stopping == "stop":
            # and its untrack went before the tick put after it: no loss reported
            assert is_tracked(manager, "j", timeout=PROMPT_S) is False
            assert get_stats(manager, timeout=PROMPT_S).lost == 0
        assert lost == []
    finally:
        stop(manager, timeout=PROMPT_S)


def _manager_in_hand(**callbacks: Any) -> tuple[ManagerRef, LockTable, ManualClock, list[object]]:
    """A manager renewing a lock table, on a clock and a timer the test moves by hand."""
    table, clock, lost = LockTable(), ManualClock(), list[object]()
    timers.clear()
    callbacks.setdefault("on_lock_renewal_failed", lost.extend)
    manager = start_link(
        renewer=table,
        keys=QueueKeys("in-hand"),
        lock_duration=TTL,
        timer=_FiredByHand,
        clock=clock,
        **callbacks,
    )
    return manager, table, clock, lost


def test_an_untrack_with_wait_during_a_callback_never_overtakes_the_same_thread_s_track() -> None:
    # Given a manager whose callback is running (held open by the test)
    inside, leave = threading.Event(), threading.Event()

    def on_renewed(_: list[str]) -> None:
        inside.set()
        leave.wait(STOP_TIMEOUT_S)

    manager, table, clock, lost = _manager_in_hand(on_locks_renewed=on_renewed)
    try:
        table.held["a"] = "ta"
        track_job(manager, "a", "ta")
        clock.advance(TTL // 2)
        manager.tell(ExtendLocks())
        assert inside.wait(PROMPT_S)

        # When another thread tracks a job, untracks it with wait=True and releases its lock
        def job() -> None:
            table.held["k"] = "tk"
            track_job(manager, "k", "tk")
            untrack_job(manager, "k", wait=True, timeout=STOP_TIMEOUT_S)
            del table.held["k"]

        worker = threading.Thread(target=job)
        worker.start()
        worker.join(PROMPT_S)
        assert not worker.is_alive()
        leave.set()
        # Then the untrack came after its track: the job is not tracked, and no tick reports it
        assert is_tracked(manager, "k", timeout=PROMPT_S) is False
        for _ in range(3):
            timers[0].fire(clock.advance(TTL // 2))
        assert get_stats(manager, timeout=PROMPT_S).lost == 0
        assert lost == []
    finally:
        leave.set()
        stop(manager, timeout=PROMPT_S)


def test_a_callback_stopping_a_job_whose_lease_is_not_yet_tracked_does_not_deadlock() -> None:
    # Given a callback that starts a job actor entering a lease (its track still
    # queued behind the callback), then stops that actor, waiting for it
    outcome: dict[str, object] = {}

    class LeasingJob(pykka.ThreadingActor):
        def on_start(self) -> None:
            self.held = lease(manager, "j", "tj").__enter__()

        def on_stop(self) -> None:
            self.held.__exit__(None, None, None)
            del table.held["j"]

    def on_renewed(_: list[str]) -> None:
        if outcome:
            return
        outcome["started"] = True
        try:
            LeasingJob.start().stop(timeout=STOP_TIMEOUT_S)
            outcome["stopped"] = True
        except Exception as error:
            outcome["stopped"] = error

    manager, table, clock, lost = _manager_in_hand(on_locks_renewed=on_renewed)
    try:
        table.held.update(a="ta", j="tj")
        track_job(manager, "a", "ta")
        clock.advance(TTL // 2)
        # When a tick calls back
        manager.tell(ExtendLocks())
        # Then the stop returned, and the lease's claim ended after its track
        wait_for(lambda: "stopped" in outcome, 2 * PROMPT_S, "the callback's stop")
        assert outcome["stopped"] is True, outcome
        assert is_tracked(manager, "j", timeout=PROMPT_S) is False
        timers[0].fire(clock.advance(TTL // 2))
        assert lost == []
    finally:
        stop(manager, timeout=PROMPT_S)


def test_a_tick_reports_nothing_found_after_its_callback_let_an_untrack_return() -> None:
    # Given a watched job, and an on_error callback during which another thread
    # untracks the job with wait=True and releases its lock, the callback taking long
    told = Inbox()

    def on_error(_: Exception) -> None:
        def job() -> None:
            untrack_job(manager, "k", wait=True, timeout=STOP_TIMEOUT_S)
            del table.held["k"]

        worker = threading.Thread(target=job)
        worker.start()
        worker.join(PROMPT_S)
        clock.advance(TTL)

    manager, table, clock, lost = _manager_in_hand(on_error=on_error)
    try:
        table.held["k"] = "tk"
        track_job(manager, "k", "tk", notify=told)
        clock.advance(TTL // 2)
        table.raise_next = True
        # When the tick's renewal call fails (and so calls back)
        manager.ask(ExtendLocks(), timeout=PROMPT_S)
        # Then that tick reported nothing after the untrack returned
        assert is_tracked(manager, "k", timeout=PROMPT_S) is False
        assert lost == []
        assert told.got == []
    finally:
        stop(manager, timeout=PROMPT_S)
