"""What a manager says: its lateness warnings, its counters, and callbacks on their own thread.

A late tick is blamed on the process only when it is later than a thread
timer can be on time; a callback or a target that fails keeps nobody else
from hearing.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import pytest

from actors import LockLost, QueueKeys, Timing, start_link, stop, track_job
from actors.messages import STOLEN, TrackJob
from actors.report import Counters
from actors.timing import resolution_ms
from tests.support import Inbox, LockTable, Recorder
from tests.support.manual import ManualClock, manual_timer, tick

if TYPE_CHECKING:
    from collections.abc import Sequence

    from actors.messages import BatchOutcome


class NoStore:
    """A renewer for a manager that tracks nothing: it is never called."""

    def __call__(self, job_ids: Sequence[str], tokens: Sequence[str]) -> BatchOutcome:
        raise AssertionError("nothing is tracked, so nothing is renewed")

    def close(self) -> None:
        """Nothing to release."""


def _late_warnings(lock_duration: int, late_ms: int, caplog: pytest.LogCaptureFixture) -> list[str]:
    """Run one timer tick ``late_ms`` after its grid time; return the warnings it logged."""
    clock, timers = ManualClock(), manual_timer()
    manager = start_link(
        renewer=NoStore(),
        keys=QueueKeys("q"),
        lock_duration=lock_duration,
        clock=clock,
        timer=timers,
    )
    try:
        with caplog.at_level(logging.WARNING, logger="actors"):
            clock.now = timers.deadline + late_ms
            tick(manager, scheduled=timers.deadline)
    finally:
        stop(manager)
    return [r.getMessage() for r in caplog.records if "late" in r.getMessage()]


def test_lateness_within_the_timers_resolution_never_blames_the_gil(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Given windows so short that a quarter of the renew window (2 ms) is
    # below what a thread timer's wake-up may cost
    lock_duration, late = 16, resolution_ms()
    assert late > Timing(lock_duration).renew_time / 4

    (warning,) = _late_warnings(lock_duration, late, caplog)

    # then the warning says the windows are too short, not that the GIL is held
    assert "GIL" not in warning
    assert "within a thread timer's resolution" in warning
    assert "milliseconds" in warning


def test_lateness_beyond_the_timers_resolution_points_at_the_process(
    caplog: pytest.LogCaptureFixture,
) -> None:
    lock_duration = 2000
    late = int(Timing(lock_duration).renew_time / 4) + 1
    assert late > resolution_ms()

    (warning,) = _late_warnings(lock_duration, late, caplog)

    assert "GIL" in warning


def test_lateness_within_a_quarter_of_the_window_is_not_warned(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert _late_warnings(2000, resolution_ms(), caplog) == []


def test_the_counters_say_how_many_ticks_failed_since_the_last_that_worked() -> None:
    counters = Counters()
    assert counters.failures() == ""

    counters.failed_streak, counters.last_error = 3, "ConnectionError: refused"

    assert counters.failures() == "3 tick(s) failed since, the last with ConnectionError: refused"


class Broken(Inbox):
    """A target whose ``tell`` raises."""

    def tell(self, message: object) -> None:
        super().tell(message)
        raise RuntimeError("the target broke")


def test_a_callback_or_target_that_raises_keeps_nobody_else_from_hearing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock, table, recorder = ManualClock(), LockTable(), Recorder()
    table.held.update({"a": "t", "b": "someone-else's"})

    def renewed(job_ids: list[str]) -> None:
        recorder.on_locks_renewed(job_ids)
        raise RuntimeError("the callback broke")

    manager = start_link(
        renewer=table,
        keys=QueueKeys("q"),
        lock_duration=1000,
        clock=clock,
        timer=manual_timer(),
        on_locks_renewed=renewed,
        on_lock_renewal_failed=recorder.on_lock_renewal_failed,
    )
    broken, told = Broken(), Inbox()
    try:
        with caplog.at_level(logging.WARNING, logger="actors"):
            track_job(manager, "a", "t")
            manager.tell(TrackJob("b", "t", notify=broken))
            manager.tell(TrackJob("b", "t", notify=told))
            clock.advance(251)
            tick(manager)
            clock.advance(251)
            tick(manager)
    finally:
        stop(manager)

    assert recorder.renewed() == {"a": 2}
    assert [lost.job_id for lost in recorder.lost()] == ["b"]
    assert broken.got == told.got == [LockLost("b", "t", STOLEN)]
    assert "on_locks_renewed raised" in caplog.text
    assert "could not tell a Broken that job 'b' lost its lock" in caplog.text
