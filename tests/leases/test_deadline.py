"""Abort before steal: a watched lock is trusted only until its deadline.

The deadline is the send time of the last renewal the server confirmed (or
the lock's taking) plus ``lock_duration`` minus the safety margin. Most tests
drive the manager by hand (a manual clock and timer, an in-memory lock table
that can be cut off), so each deadline is exact; two run on the real clock,
with the renewal stuck in a call and the manager's own thread held (in a
reading of its clock), to show that a waiting job is woken at the deadline
by its own lease, whatever the manager is doing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

import actors
from actors import (
    ExtendLocks,
    GetStats,
    LockLost,
    LostLock,
    ManagerRef,
    QueueKeys,
    Timing,
    lease,
)
from actors.messages import BatchOutcome
from actors.timing import default_safety_margin, monotonic_ms
from tests.support import (
    HoldingClock,
    Inbox,
    LockTable,
    ManualClock,
    ManualTimers,
    Recorder,
    delivered,
    settle,
    tick,
)

if TYPE_CHECKING:
    from tests.conftest import StartManager

KEYS = QueueKeys("deadline")
TIMING = Timing()
MARGIN = default_safety_margin(TIMING)
#: How long a watched lock is trusted after a confirmed send, by default.
SPAN = TIMING.lock_duration - MARGIN


class Link:
    """An in-memory lock table behind a link that can be cut, or that pauses the clock.

    Args:
        clock: The manager's clock, moved on by :attr:`pause_ms` during a call.
    """

    def __init__(self, clock: ManualClock) -> None:
        self.table = LockTable()
        self.clock = clock
        self.down = False
        #: Ms the next call takes (a slow answer, a paused process).
        self.pause_ms = 0
        self.calls = 0

    def __call__(self, job_ids: Sequence[str], tokens: Sequence[str]) -> BatchOutcome:
        self.calls += 1
        self.clock.advance(self.pause_ms)
        self.pause_ms = 0
        if self.down:
            raise RedisConnectionError("Timeout connecting to server")
        return self.table(job_ids, tokens)

    def close(self) -> None:
        self.table.close()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def link(clock: ManualClock) -> Link:
    return Link(clock)


@pytest.fixture
def timers() -> ManualTimers:
    return ManualTimers()


@pytest.fixture
def reports() -> Recorder:
    return Recorder()


@pytest.fixture
def manager(
    link: Link,
    clock: ManualClock,
    timers: ManualTimers,
    reports: Recorder,
    start_manager: StartManager,
) -> ManagerRef:
    return start_manager(renewer=link, keys=KEYS, clock=clock, timer=timers, **reports.callbacks())


def _grid_tick(manager: ManagerRef, clock: ManualClock, timers: ManualTimers) -> int:
    """Run the timer's next fire at its time; return that time."""
    at = timers.deadline
    clock.now = max(clock.now, at)
    tick(manager, scheduled=at)
    return at


def test_a_lease_sees_its_deadline_pass_at_its_first_look_with_no_tick(
    manager: ManagerRef, link: Link, clock: ManualClock
) -> None:
    link.table.held["j"] = "t"
    taken = clock.now
    with lease(manager, "j", "t") as held:
        assert held.deadline == taken + SPAN
        link.down = True
        clock.now = taken + SPAN - 1
        held.check()
        assert not held.lost
        # The process "wakes" at the deadline: the very first look says so.
        clock.now = taken + SPAN
        with pytest.raises(LockLost) as raised:
            held.check()
    assert raised.value.reason == "unconfirmed"
    assert f"no renewal confirmed for {SPAN} ms" in raised.value.detail
    assert actors.get_tracked_job_ids(manager) == []


def test_a_confirmed_renewal_moves_the_deadline_to_its_send_plus_the_span(
    manager: ManagerRef, link: Link, clock: ManualClock, timers: ManualTimers
) -> None:
    link.table.held["j"] = "t"
    with lease(manager, "j", "t") as held:
        sent = _grid_tick(manager, clock, timers)
        assert held.deadline == sent + SPAN
        link.down = True
        failed = _grid_tick(manager, clock, timers)
        assert failed > sent
        assert held.deadline == sent + SPAN  # a failed renewal confirms nothing


def test_a_watcher_is_told_by_the_timer_at_the_deadline_not_at_the_next_tick(
    manager: ManagerRef, link: Link, clock: ManualClock, timers: ManualTimers, reports: Recorder
) -> None:
    link.table.held["j"] = "t"
    target = Inbox()
    actors.track_job(manager, "j", "t", notify=target)
    sent = _grid_tick(manager, clock, timers)
    link.down = True
    grid: list[int] = []
    while timers.deadline != sent + SPAN:
        grid.append(_grid_tick(manager, clock, timers))
    # The timer is armed for the deadline, before the grid tick after it.
    assert grid and grid[-1] + TIMING.interval > sent + SPAN
    calls = link.calls
    clock.now = sent + SPAN
    tick(manager, scheduled=sent + SPAN)
    assert link.calls == calls  # the deadline's fire renews nothing
    assert target.got == [LockLost("j", "t", "unconfirmed")]
    assert actors.get_tracked_job_ids(manager) == []
    [lost] = reports.lost()
    assert isinstance(lost, LostLock)
    assert lost.reason == "unconfirmed"
    assert f"{len(grid)} tick(s) failed since" in lost.detail
    assert "Timeout connecting to server" in lost.detail
    # The lock is left to expire: nothing more is sent for it.
    _grid_tick(manager, clock, timers)
    assert link.calls == calls


def test_a_plain_job_keeps_the_original_rule_a_redis_fault_untracks_nothing(
    manager: ManagerRef, link: Link, clock: ManualClock, timers: ManualTimers
) -> None:
    link.table.held["j"] = "t"
    actors.track_job(manager, "j", "t")
    link.down = True
    start = clock.now
    while clock.now < start + 3 * TIMING.lock_duration:
        _grid_tick(manager, clock, timers)
    assert actors.get_tracked_job_ids(manager) == ["j"]


def test_a_renewal_answered_after_the_deadline_still_loses_the_lock(
    manager: ManagerRef, link: Link, clock: ManualClock, timers: ManualTimers
) -> None:
    link.table.held["j"] = "t"
    target = Inbox()
    actors.track_job(manager, "j", "t", notify=target)
    sent = _grid_tick(manager, clock, timers)
    # The next renewal's answer comes only once its lock's deadline is past:
    # a job that looked meanwhile was told the lock may be gone, so it is.
    link.pause_ms = SPAN
    _grid_tick(manager, clock, timers)
    assert clock.now >= sent + SPAN
    [told] = target.got
    assert told == LockLost("j", "t", "unconfirmed")
    assert "a renewal's answer came only after the deadline" in told.detail
    assert actors.get_tracked_job_ids(manager) == []


def test_a_healthy_watched_lock_is_never_told(
    manager: ManagerRef, link: Link, clock: ManualClock, timers: ManualTimers
) -> None:
    link.table.held["j"] = "t"
    target = Inbox()
    actors.track_job(manager, "j", "t", notify=target)
    for _ in range(50):
        # Each tick late by a quarter of an interval: far more than a healthy machine's.
        at = timers.deadline
        clock.now = at + TIMING.interval // 4
        tick(manager, scheduled=at)
    assert target.got == []
    assert actors.get_tracked_job_ids(manager) == ["j"]


def test_a_lease_margin_of_its_own_brings_its_deadline_forward(
    manager: ManagerRef, link: Link, clock: ManualClock
) -> None:
    link.table.held["j"] = "t"
    taken = clock.now
    with lease(manager, "j", "t", safety_margin=10_000) as held:
        assert held.deadline == taken + TIMING.lock_duration - 10_000
        with lease(manager, "j", "t") as other:
            settle(manager)
            # One deadline per lock: the most careful of its watchers' margins.
            assert other.deadline == held.deadline


@pytest.mark.parametrize(
    ("margin", "error", "match"),
    [
        ("1000", TypeError, "safety_margin must be an int"),
        (-1, ValueError, "safety_margin must be at least 0"),
        (
            TIMING.lock_duration - TIMING.interval,
            ValueError,
            r"safety_margin must be below lock_duration - interval \(30000 - 7500 = 22500 ms\)",
        ),
    ],
)
def test_a_margin_that_does_not_fit_fails_at_the_caller(
    manager: ManagerRef, margin: object, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        actors.start_link(renewer=LockTable(), keys=KEYS, safety_margin=margin)  # type: ignore[arg-type]
    with pytest.raises(error, match=match):
        lease(manager, "j", "t", safety_margin=margin)  # type: ignore[arg-type]


def test_the_loss_warning_logs_what_was_observed(
    manager: ManagerRef,
    link: Link,
    clock: ManualClock,
    timers: ManualTimers,
    caplog: pytest.LogCaptureFixture,
) -> None:
    link.table.held["j"] = "t"
    actors.track_job(manager, "j", "t", notify=Inbox())
    link.down = True
    with caplog.at_level(logging.WARNING, logger="actors.lock_manager"):
        while actors.get_tracked_job_ids(manager):
            _grid_tick(manager, clock, timers)
    [line] = [r.getMessage() for r in caplog.records if "lost the lock" in r.getMessage()]
    assert "job 'j' (unconfirmed: no renewal confirmed for" in line
    assert "tick(s) failed since, the last with ConnectionError" in line


# -- on the real clock: the manager can tell nobody, the job is woken anyway --

LOCK_MS = 800
#: Most seconds the manager takes to read its clock once asked, on a loaded machine.
PROMPT_S = 5.0


class Stuck:
    """A renewer whose calls never answer until :meth:`close`: a black-holed connection."""

    def __init__(self) -> None:
        self.table = LockTable(gated=True)

    def __call__(self, job_ids: Sequence[str], tokens: Sequence[str]) -> BatchOutcome:
        return self.table(job_ids, tokens)

    def close(self) -> None:
        self.table.close()


def _stuck_manager() -> tuple[ManagerRef, Stuck, HoldingClock]:
    """A manager on the real clock whose renewals never answer, and a clock to hold it by."""
    stuck, clock = Stuck(), HoldingClock(source=monotonic_ms)
    stuck.table.held["j"] = "t"
    manager = actors.start_link(renewer=stuck, keys=KEYS, lock_duration=LOCK_MS, clock=clock)
    settle(manager)
    return manager, stuck, clock


def _hold(manager: ManagerRef, clock: HoldingClock) -> None:
    """Hold the manager's own thread: it handles nothing (no timer fire) until released."""
    clock.hold(manager._manager.thread)
    manager.ask(GetStats(), block=False)
    clock.wait_held(PROMPT_S)


def test_wait_wakes_at_the_deadline_while_the_manager_can_tell_nobody() -> None:
    manager, stuck, clock = _stuck_manager()
    try:
        with lease(manager, "j", "t") as held:
            deadline = held.deadline
            assert deadline is not None
            _hold(manager, clock)
            assert held.wait(timeout=10)
            woke = monotonic_ms()
            # The partition heals and the manager goes on: the lease's exit can be answered.
            clock.release()
            stuck.close()
            assert held.reason == "unconfirmed"
            # Woken by its own timeout at the deadline: the manager could tell it nothing.
            assert deadline <= woke < deadline + 50 + Timing(LOCK_MS).interval
    finally:
        clock.release()
        stuck.close()
        actors.stop(manager)


def test_wait_async_wakes_at_the_deadline_while_the_manager_can_tell_nobody() -> None:
    manager, stuck, clock = _stuck_manager()

    async def job() -> tuple[int | None, int, bool]:
        async with lease(manager, "j", "t") as held:
            _hold(manager, clock)
            lost = await held.wait_async(timeout=10)
            woke = monotonic_ms()
            clock.release()
            stuck.close()
            return held.deadline, woke, lost

    try:
        started = time.monotonic()
        deadline, woke, lost = asyncio.run(job())
        assert lost
        assert deadline is not None
        assert deadline <= woke < deadline + 50 + Timing(LOCK_MS).interval
        assert time.monotonic() - started < 5
    finally:
        clock.release()
        stuck.close()
        actors.stop(manager)


def test_a_scheduled_extend_locks_sent_by_hand_is_no_deadline_fire(
    manager: ManagerRef, link: Link, clock: ManualClock, timers: ManualTimers
) -> None:
    link.table.held["j"] = "t"
    target = Inbox()
    actors.track_job(manager, "j", "t", notify=target)
    # A forged timer message for a time no deadline was armed for renews as "renew now".
    clock.advance(TIMING.threshold + 1)
    calls = link.calls
    manager.ask(ExtendLocks(clock.now - 1))
    assert link.calls == calls + 1
    assert target.got == []


def test_every_watcher_of_a_lock_is_told_once_and_the_plain_claim_ends_too(
    manager: ManagerRef, link: Link, clock: ManualClock, timers: ManualTimers, reports: Recorder
) -> None:
    link.table.held["j"] = "t"
    first, second = Inbox(), Inbox()
    actors.track_job(manager, "j", "t")
    actors.track_job(manager, "j", "t", notify=first)
    actors.track_job(manager, "j", "t", notify=second)
    link.down = True
    while actors.get_tracked_job_ids(manager):
        _grid_tick(manager, clock, timers)
    assert first.got == second.got == [LockLost("j", "t", "unconfirmed")]
    assert [(lost.job_id, lost.reason) for lost in reports.lost()] == [("j", "unconfirmed")]
    # Tracked again with the same token, the lost lock is neither renewed nor told again.
    actors.track_job(manager, "j", "t", notify=first)
    delivered(manager)
    assert first.got == [LockLost("j", "t", "unconfirmed")]
    assert actors.get_tracked_job_ids(manager) == []
