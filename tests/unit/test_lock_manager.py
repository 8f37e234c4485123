"""The manager with its public seams: a manual clock and timer, an in-memory lock table.

Each asked tick returns once its renewal has landed and its report was
delivered (the callbacks ran, the targets were told), so every check here
looks at a finished step. No Redis is involved.
"""

from __future__ import annotations

import linecache
import logging
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

import pykka
import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from actors import (
    LockManager,
    ManagerRef,
    ManagerStopped,
    QueueKeys,
    TrackJob,
    get_stats,
    get_tracked_job_ids,
    start_link,
    stop,
    track_job,
    untrack_job,
)
from actors.lock_manager import CLOSE_WAIT_S, TicksFirst
from actors.messages import MESSAGES, UNCONFIRMED, LockLost
from tests.support import (
    Inbox,
    LockTable,
    ManualClock,
    Recorder,
    manual_timer,
    settle,
    tick,
    wait_for,
)

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence
    from types import FrameType

    from actors.messages import BatchOutcome
    from tests.support import ManualTimers

# Nothing listens here: these tests must fail before any command is sent.
UNUSED_URL = "redis://127.0.0.1:1/0"
#: lock_duration 1000 ms: the renew window 500, the interval and threshold 250,
#: the default safety margin 125, so a watched lock is trusted 875 ms.
LOCK = 1000
INTERVAL = 250
TRUSTED = 875


class Refused(LockTable):
    """A lock table whose server refuses every call, as a dropped connection does."""

    def __call__(self, job_ids: Sequence[str], tokens: Sequence[str]) -> BatchOutcome:
        self.sent.append((0, list(job_ids)))
        raise RedisConnectionError("connection refused")


class Slow(LockTable):
    """A lock table whose next call takes ``pause`` ms on the clock, then fails."""

    def __init__(self, clock: ManualClock) -> None:
        super().__init__()
        self.clock = clock
        self.pause = 0

    def __call__(self, job_ids: Sequence[str], tokens: Sequence[str]) -> BatchOutcome:
        if self.pause:
            self.clock.advance(self.pause)
            self.pause = 0
            raise RedisConnectionError("connection reset")
        return super().__call__(job_ids, tokens)


class Fixture:
    """A manager on a manual clock and timer, renewing through ``table``."""

    def __init__(self, table: LockTable, clock: ManualClock | None = None) -> None:
        self.clock = clock or ManualClock()
        self.timers: ManualTimers = manual_timer()
        self.table = table
        self.recorder = Recorder()
        self.manager: ManagerRef = start_link(
            renewer=table,
            keys=QueueKeys("q"),
            lock_duration=LOCK,
            clock=self.clock,
            timer=self.timers,
            **self.recorder.callbacks(),
        )

    def fire(self, late: int = 0) -> int:
        """Let the timer fire (``late`` ms after its time); return the time it fired for."""
        scheduled = self.timers.deadline
        self.clock.now = max(self.clock.now, scheduled + late)
        tick(self.manager, scheduled=scheduled)
        return scheduled


@pytest.fixture
def refused() -> Iterator[Fixture]:
    fixture = Fixture(Refused())
    yield fixture
    stop(fixture.manager)


@pytest.fixture
def held() -> Iterator[Fixture]:
    fixture = Fixture(LockTable())
    yield fixture
    stop(fixture.manager)


def test_every_message_has_a_handler_of_its_own_and_a_proxy_door() -> None:
    handlers = LockManager._handlers

    assert set(MESSAGES) <= set(handlers)
    assert len({handlers[kind] for kind in MESSAGES}) == len(MESSAGES)
    # pykka's proxy lists the actor's methods: one per operation.
    for kind in MESSAGES:
        assert callable(getattr(LockManager, kind.operation))  # type: ignore[attr-defined]


def test_a_manager_class_started_directly_hands_out_a_checked_reference() -> None:
    ref = LockManager.start(connection=UNUSED_URL, keys=QueueKeys("q"))
    try:
        assert isinstance(ref, ManagerRef)
        with pytest.raises(ValueError, match="job_id"):
            ref.proxy().track_job("", "t")
        assert ref.is_alive()
    finally:
        stop(ref)


def test_a_message_the_manager_cannot_take_is_dropped_with_a_warning_and_it_lives(
    held: Fixture, caplog: pytest.LogCaptureFixture
) -> None:
    # A margin is checked against the windows of the manager it reaches: this
    # one leaves less than an interval (1000 - 250) for the lock's renewal.
    caplog.set_level(logging.WARNING, logger="actors")
    held.manager.tell(TrackJob("j", "t", notify=Inbox(), safety_margin=800))
    track_job(held.manager, "k", "t")

    assert get_tracked_job_ids(held.manager, timeout=5) == ["k"]
    # Logged on the manager's record thread, soon after.
    wait_for(
        lambda: [r for r in caplog.records if "dropped a TrackJob" in r.getMessage()],
        5,
        "the warning",
    )
    dropped = [r for r in caplog.records if "dropped a TrackJob" in r.getMessage()]
    assert len(dropped) == 1
    assert dropped[0].exc_info is not None and "safety_margin" in str(dropped[0].exc_info[1])


def test_an_asked_tick_returns_once_its_callbacks_ran(held: Fixture) -> None:
    held.table.held.update({"a": "t", "b": "t"})
    track_job(held.manager, "a", "t")
    track_job(held.manager, "b", "other")
    held.clock.advance(INTERVAL + 1)

    tick(held.manager)

    assert held.recorder.renewed() == {"a": 1}
    assert [(lost.job_id, lost.reason) for lost in held.recorder.lost()] == [("b", "stolen")]


def test_a_failed_tick_is_tried_again_soon_then_the_grid_goes_on(held: Fixture) -> None:
    held.table.held["j"] = "t"
    track_job(held.manager, "j", "t", ts=held.clock.now - INTERVAL)
    grid = held.timers.deadline

    held.table.raise_next = True
    assert held.fire() == grid
    # The first retry 10 ms after the failed answer, the next twice as far.
    assert held.timers.deadline == grid + 10
    held.table.raise_next = True
    held.fire()
    assert held.timers.deadline == grid + 10 + 20
    held.fire()

    # Renewed on the retry: the grid ticks on where it was.
    assert held.timers.deadline == grid + INTERVAL
    assert [ids for _, ids in held.table.sent] == [["j"], ["j"], ["j"]]
    assert held.recorder.renewed() == {"j": 1}
    assert len(held.recorder.errors()) == 2
    stats = get_stats(held.manager, timeout=5)
    assert (stats.ticks, stats.errors, stats.renewed) == (3, 2, 1)


def test_a_retry_waits_at_most_a_quarter_of_the_interval(refused: Fixture) -> None:
    track_job(refused.manager, "j", "t", ts=refused.clock.now - INTERVAL)
    refused.fire()

    pauses = []
    for _ in range(5):
        answered = refused.clock.now
        pauses.append(refused.timers.deadline - answered)
        refused.fire()

    assert pauses == [10, 20, 40, INTERVAL // 4, INTERVAL // 4]


def test_a_watched_lock_nobody_confirms_is_let_go_at_its_deadline_saying_why(
    refused: Fixture,
) -> None:
    target = Inbox()
    taken = refused.clock.now
    refused.manager.ask(TrackJob("j", "t", ts=taken, notify=target), timeout=5)
    deadline = taken + TRUSTED

    while refused.timers.deadline < deadline:
        refused.fire()
    assert refused.timers.deadline == deadline
    calls = len(refused.table.sent)
    refused.fire(late=50)

    [lost] = refused.recorder.lost()
    assert (lost.job_id, lost.token, lost.reason) == ("j", "t", UNCONFIRMED)
    assert f"no renewal confirmed for {TRUSTED + 50} ms" in lost.detail
    assert f"{calls} tick(s) failed since, the last with ConnectionError" in lost.detail
    assert "did not run for 50 ms past its timer (a pause)" in lost.detail
    assert target.got == [LockLost("j", "t", UNCONFIRMED)]
    assert get_tracked_job_ids(refused.manager, timeout=5) == []


def test_a_lock_taken_before_its_track_keeps_the_stamp_of_its_taking(held: Fixture) -> None:
    # A lock never looks younger than it is: a ts from the future is now.
    held.table.held.update({"old": "t", "future": "t"})
    track_job(held.manager, "old", "t", ts=held.clock.now - INTERVAL)
    track_job(held.manager, "future", "t", ts=held.clock.now + 10 * INTERVAL)
    settle(held.manager)
    held.clock.advance(1)

    tick(held.manager)
    assert held.recorder.renewed() == {"old": 1}
    held.clock.advance(INTERVAL)
    tick(held.manager)
    assert held.recorder.renewed() == {"old": 1, "future": 1}


def test_a_retry_due_at_the_grids_time_is_done_by_the_grid_tick(held: Fixture) -> None:
    # A renew now fails 10 ms before the grid: its retry falls on the grid's time.
    grid = held.timers.deadline
    held.table.held["j"] = "t"
    track_job(held.manager, "j", "t", ts=held.clock.now - INTERVAL)
    held.clock.now = grid - 10
    held.table.raise_next = True
    tick(held.manager)
    assert held.timers.deadline == grid
    untrack_job(held.manager, "j", wait=True)

    assert held.fire() == grid

    # One tick for one time: the timer is not armed again for the time it just fired for.
    assert held.timers.deadline == grid + INTERVAL
    assert get_stats(held.manager, timeout=5).ticks == 2


def test_a_failed_renewal_answered_past_a_watched_deadline_lets_the_lock_go_as_it_lands() -> None:
    clock = ManualClock()
    table = Slow(clock)
    slow = Fixture(table, clock)
    try:
        target = Inbox()
        table.held["j"] = "t"
        slow.manager.ask(TrackJob("j", "t", ts=clock.now, notify=target), timeout=5)
        table.pause = TRUSTED  # the call is out past the lock's deadline, then fails

        slow.fire()

        # Decided with the failed renewal, before its callbacks: the tick asked is finished.
        assert [(lost.job_id, lost.reason) for lost in slow.recorder.lost()] == [("j", UNCONFIRMED)]
        assert target.got == [LockLost("j", "t", UNCONFIRMED)]
        assert get_tracked_job_ids(slow.manager, timeout=5) == []
    finally:
        stop(slow.manager)


def test_an_ask_held_up_in_the_mailbox_past_the_stop_s_wait_is_refused_not_left_unread() -> None:
    # A sender past its look at "closed" but not yet in (a debugger, a signal
    # handler on its thread) was not waited for past CLOSE_WAIT_S: its message
    # went in after the manager's last look, and its ask never got an answer.
    manager = start_link(
        renewer=LockTable(),
        keys=QueueKeys("q"),
        lock_duration=1000,
        clock=ManualClock(),
        timer=manual_timer(),
    )
    put = TicksFirst.post.__code__
    held_up = threading.Event()
    outcome: list[object] = []

    def hold_before_the_put(frame: FrameType, event: str, arg: object) -> Any:
        if frame.f_code is not put:
            return None

        def line(frame: FrameType, event: str, arg: object) -> Any:
            if event == "line" and "self._line.append(numbered)" in linecache.getline(
                frame.f_code.co_filename, frame.f_lineno
            ):
                held_up.set()
                time.sleep(CLOSE_WAIT_S + 0.5)
            return line

        return line

    def ask() -> None:
        sys.settrace(hold_before_the_put)
        try:
            outcome.append(get_tracked_job_ids(manager, timeout=CLOSE_WAIT_S + 5))
        except Exception as exc:
            outcome.append(exc)
        finally:
            sys.settrace(None)

    asker = threading.Thread(target=ask)
    asker.start()
    assert held_up.wait(5)
    stop(manager, timeout=10)
    asker.join(CLOSE_WAIT_S + 10)

    [refused] = outcome
    assert isinstance(refused, ManagerStopped | pykka.ActorDeadError), refused
