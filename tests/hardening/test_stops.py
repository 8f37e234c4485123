"""A stop behind a busy tick, a clock that raises, a lease whose entry fails.

The manager runs with its public seams only (an in-memory lock table as its
renewer, a manual clock and timer): no Redis is involved.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import pykka
import pytest

import actors
from actors import (
    ExtendLocks,
    LockLost,
    ManagerStopped,
    QueueKeys,
    TrackJob,
    get_stats,
    is_tracked,
    lease,
    start_link,
    track_job,
)
from actors.messages import IsTracked
from actors.schedule import Timing
from tests.leases.tools import LockTable
from tests.support import ManualClock, ManualTimers, settle, tick

KEYS = QueueKeys("stops")
TIMING = Timing(800)
#: Seconds any answer may take: far above a healthy one, so only a hang trips it.
WAIT_S = 10.0


class Inbox:
    """A notify target (a job actor, say) that keeps what it is told."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._got: list[Any] = []

    def tell(self, message: Any) -> None:
        with self._lock:
            self._got.append(message)

    @property
    def got(self) -> list[Any]:
        """Every message told so far, in order."""
        with self._lock:
            return list(self._got)


class FlakyClock(ManualClock):
    """A manual clock whose next reading raises when :attr:`fail_next` is set."""

    fail_next = False

    def __call__(self) -> int:
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("the clock failed")
        return self.now


def test_a_stop_behind_a_busy_tick_tells_every_target_and_fails_every_ask() -> None:
    # Given a manager busy with a tick, and a stop waiting behind it
    gated = LockTable(gated=True)
    manager = start_link(renewer=gated, keys=KEYS, timer=ManualTimers())
    manager.tell(TrackJob("other", "t", ts=0))
    manager.tell(ExtendLocks())
    assert gated.entered.wait(WAIT_S)
    manager.stop(block=False)
    # when a job asks to be told of its lock's loss, and a query waits, behind the stop
    target = Inbox()
    track_job(manager, "j", "t", notify=target)
    pending = manager.ask(IsTracked("j"), block=False)
    gated.gate.set()
    # then the stop tells the target nobody renews its lock, and fails the query as stopped
    with contextlib.suppress(pykka.ActorDeadError):
        pending.get(timeout=WAIT_S)
    assert target.got == [LockLost("j", "t", "manager_stopped")]
    with pytest.raises(ManagerStopped):
        pending.get(timeout=0)


def test_a_clock_that_raises_once_does_not_stop_the_ticks() -> None:
    # Given a manager whose one job is due at the timer's next tick
    clock, timers, table = FlakyClock(), ManualTimers(), LockTable()
    manager = start_link(
        renewer=table, keys=KEYS, clock=clock, timer=timers, lock_duration=TIMING.lock_duration
    )
    table.held["j"] = "t"
    track_job(manager, "j", "t", ts=clock.now - TIMING.renew_time)
    settle(manager)
    scheduled = timers.deadline
    clock.now = scheduled
    # when the clock raises as that tick reads it
    clock.fail_next = True
    tick(manager, scheduled=scheduled)
    # then the tick still renewed the job, and the timer is armed for the next one
    assert get_stats(manager).renewed == 1
    assert timers.deadline == scheduled + TIMING.interval
    # and the ticks go on
    clock.now = timers.deadline + TIMING.interval
    tick(manager, scheduled=timers.deadline)
    assert timers.deadline > scheduled + TIMING.interval
    assert manager.is_alive()


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


def test_a_track_read_while_the_clock_raises_is_kept() -> None:
    # Given a manager whose clock raises at its next reading
    clock, table = FlakyClock(), LockTable()
    manager = start_link(renewer=table, keys=KEYS, clock=clock, timer=ManualTimers())
    clock.fail_next = True
    # when a job stamped by its caller is tracked
    track_job(manager, "j", "t", ts=clock.now)
    # then it is tracked all the same
    assert is_tracked(manager, "j")
