"""The manager's timer: its thread fires whatever its clock does; its alarm says when and why."""

from __future__ import annotations

import itertools
import logging
import threading
import time

import pytest

from actors import ManualTimer, ThreadTimer
from actors.timer import Alarm
from tests.support import FlakyClock, ManualClock

#: Longest wait for a fire that is already due, in seconds.
SETTLE_S = 5.0


def test_a_clock_that_raises_once_still_lets_the_timer_fire(
    caplog: pytest.LogCaptureFixture,
) -> None:
    reads = itertools.count()

    def clock() -> int:
        if next(reads) == 0:
            raise RuntimeError("the clock broke once")
        return time.monotonic_ns() // 1_000_000

    fired = threading.Event()
    timer = ThreadTimer(lambda deadline: fired.set(), "timer-under-test", clock=clock)
    try:
        with caplog.at_level(logging.ERROR, logger="actors.timer"):
            timer.arm(0)
            assert fired.wait(SETTLE_S), "the timer never fired after its clock raised"
        assert "the clock raised" in caplog.text
    finally:
        timer.close()


# -- the alarm: what the manager's one timer is armed for ----------------------------------

INTERVAL = 100


def alarm() -> tuple[Alarm, ManualClock, ManualTimer]:
    """An alarm on a manual clock, started: armed for the first grid tick."""
    clock, timer = ManualClock(), ManualTimer()
    started = Alarm("q", clock, INTERVAL)
    started.start(timer)
    return started, clock, timer


def test_the_first_tick_is_one_interval_after_the_start() -> None:
    started, clock, timer = alarm()

    assert timer.deadline == clock.now + INTERVAL
    assert started.grid == timer.deadline


def test_without_a_grid_nothing_is_armed_until_somebody_needs_it() -> None:
    clock, timer = ManualClock(), ManualTimer()
    waiting = Alarm("q", clock, INTERVAL)
    waiting.start(timer, grid=False)
    assert timer.armed == 0

    waiting.arm(clock.now + 30)  # a watched lock's deadline

    assert timer.deadline == clock.now + 30


def test_a_grid_tick_stamps_at_its_grid_time_and_says_how_late_it_ran() -> None:
    started, clock, timer = alarm()
    scheduled = timer.deadline
    assert scheduled is not None
    clock.now = scheduled + 7

    assert started.take(scheduled) == ("grid", scheduled + 7, scheduled, 7)
    started.advance(scheduled, clock.now)
    started.arm(None)
    assert timer.deadline == scheduled + INTERVAL


def test_an_overrun_fires_the_latest_missed_grid_time_once_not_a_burst() -> None:
    started, clock, timer = alarm()
    scheduled = timer.deadline
    assert scheduled is not None
    clock.now = scheduled + 3 * INTERVAL + 40

    started.take(scheduled)
    started.advance(scheduled, clock.now)
    started.arm(None)

    assert timer.deadline == scheduled + 3 * INTERVAL
    assert started.take(timer.deadline)[0:2] == ("grid", clock.now)  # type: ignore[index]
    started.advance(scheduled + 3 * INTERVAL, clock.now)
    started.arm(None)
    assert timer.deadline == scheduled + 4 * INTERVAL


@pytest.mark.parametrize("scheduled", [None, "early", "not armed"])
def test_a_renew_now_moves_nothing(scheduled: str | None) -> None:
    started, clock, timer = alarm()
    grid = timer.deadline
    assert grid is not None
    sent = {None: None, "early": grid, "not armed": clock.now - 5}[scheduled]

    # A fire sent before its time, or for a time never armed, is anyone's "renew now".
    assert started.take(sent) == ("now", clock.now, clock.now, 0)
    started.arm(None)

    assert timer.deadline == grid and started.grid == grid
    clock.now = grid
    assert started.take(grid) == ("grid", grid, grid, 0)


def test_a_retry_comes_before_the_grid_and_is_taken_once() -> None:
    started, clock, timer = alarm()
    grid = timer.deadline
    assert grid is not None
    started.retry_at(clock.now + 10)
    started.arm(None)
    assert timer.deadline == clock.now + 10

    clock.advance(12)
    assert started.take(clock.now - 2) == ("retry", clock.now, clock.now, 2)
    started.arm(None)

    assert started.retry is None
    assert timer.deadline == grid


def test_a_watched_deadline_before_the_grid_is_armed_and_fires_as_a_deadline() -> None:
    started, clock, timer = alarm()
    grid = timer.deadline
    assert grid is not None

    started.sooner(grid + 5)  # later than the grid: nothing changes
    assert timer.deadline == grid
    started.sooner(clock.now + 30)
    assert timer.deadline == clock.now + 30

    clock.advance(30)
    assert started.take(clock.now) == ("deadline", clock.now, clock.now, 0)


def test_lateness_counts_from_when_the_timer_was_armed_if_that_was_later() -> None:
    started, clock, _ = alarm()
    clock.advance(50)
    started.arm(clock.now - 20)  # a deadline already past when it was armed
    clock.advance(5)

    assert started.take(clock.now - 25) == ("deadline", clock.now, clock.now, 5)


def test_a_clock_that_raises_lets_the_timers_own_fire_tick_at_its_time() -> None:
    clock, timer = FlakyClock(), ManualTimer()
    started = Alarm("q", clock, INTERVAL)
    started.start(timer)
    scheduled = timer.deadline
    assert scheduled is not None

    clock.fail_next = True
    assert started.take(None) is None
    clock.now = scheduled + 3
    clock.fail_next = True
    assert started.take(scheduled) == ("grid", scheduled, scheduled, 0)


def test_a_closed_alarm_arms_nothing_and_hands_its_timer_back() -> None:
    started, clock, timer = alarm()

    assert started.close() is timer
    started.arm(clock.now + 1)

    assert timer.armed == 1 and started.close() is None


def test_a_grid_tick_at_the_retrys_time_does_the_retrys_work() -> None:
    # A retry falls on the grid's time: the grid's tick renews what is due,
    # so the timer is not armed again for the time it just handled.
    started, clock, timer = alarm()
    grid = timer.deadline
    assert grid is not None
    started.retry_at(grid)
    started.arm(None)
    clock.now = grid

    assert started.take(grid) == ("grid", grid, grid, 0)
    started.advance(grid, clock.now)
    started.arm(None)

    assert timer.deadline == grid + INTERVAL
