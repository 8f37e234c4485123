"""A manager's outbox: tracks and untracks read in one go, in order, at the next tick at the latest.

Through the manager's public seams (a manual clock and timer, an in-memory
lock table), and once with its own timer thread: no Redis is involved.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import pytest

from actors import (
    ExtendLocks,
    ManagerStopped,
    QueueKeys,
    TrackJob,
    UntrackJob,
    get_tracked_job_ids,
    start_link,
    stop,
)
from actors.jobs import Validity
from actors.messages import MANAGER_STOPPED, LockLost
from actors.ref import UNREAD, Reply
from tests.support import Inbox, LockTable, ManualClock, Recorder, manual_timer, tick, wait_for

if TYPE_CHECKING:
    from collections.abc import Iterator

    from actors import ManagerRef

#: lock_duration 1000 ms: the interval and threshold are 250 ms.
LOCK = 1000
INTERVAL = 250
#: Longest wait for another thread, in seconds.
WAIT_S = 10.0


class Manual:
    """A manager on a manual clock and timer, renewing through an in-memory lock table."""

    def __init__(self) -> None:
        self.clock = ManualClock()
        self.timers = manual_timer()
        self.table = LockTable()
        self.recorder = Recorder()
        self.manager: ManagerRef = start_link(
            renewer=self.table,
            keys=QueueKeys("q"),
            lock_duration=LOCK,
            clock=self.clock,
            timer=self.timers,
            **self.recorder.callbacks(),
        )

    def fire(self) -> None:
        """Let the timer fire at its time, and wait for the tick."""
        scheduled = self.timers.deadline
        self.clock.now = max(self.clock.now, scheduled)
        tick(self.manager, scheduled=scheduled)


@pytest.fixture
def manual() -> Iterator[Manual]:
    fixture = Manual()
    yield fixture
    stop(fixture.manager)


def test_a_track_waits_in_the_outbox_until_the_next_message_and_keeps_its_time(
    manual: Manual,
) -> None:
    outbox = manual.manager.outbox()
    manual.table.held["j"] = "t"
    taken = manual.clock.now
    target = Inbox()
    reply = outbox.put(TrackJob("j", "t", taken, target))
    manual.clock.advance(INTERVAL + 1)
    assert reply.value is UNREAD  # nothing woke the manager

    manual.fire()
    # Read before the tick, at its caller's time: due at once, as a track sent then.
    assert isinstance(reply.value, Validity)
    assert manual.recorder.renewed() == {"j": 1}
    assert reply.value.deadline > taken + INTERVAL


@pytest.mark.parametrize("first", [True, False], ids=["first-put", "later-put"])
def test_a_put_with_wake_is_read_at_once_with_what_waits_before_it(
    manual: Manual, first: bool
) -> None:
    # Given tracks waiting in the outbox (or none), with no tick due,
    outbox = manual.manager.outbox()
    now = manual.clock.now
    waiting = [] if first else [outbox.put(TrackJob(f"w{n}", "t", now)) for n in range(3)]
    # When a late track is put with wake,
    late = outbox.put(TrackJob("late", "t", manual.clock.now, Inbox()), wake=True)
    # Then the manager reads it, and everything put before it, with no tick (the
    # manual timer never fires by itself).
    wait_for(lambda: late.value is not UNREAD, WAIT_S, "the woken manager to read the track")
    assert isinstance(late.value, Validity)
    assert all(reply.value is not UNREAD for reply in waiting)


def test_the_outbox_is_read_before_any_message_sent_after_it(manual: Manual) -> None:
    outbox = manual.manager.outbox()
    outbox.put(TrackJob("a", "t"))
    outbox.put(TrackJob("b", "t"))
    outbox.put(UntrackJob("a", "t"))
    manual.manager.tell(UntrackJob("b"))
    outbox.put(TrackJob("c", "t"))

    assert sorted(get_tracked_job_ids(manual.manager)) == ["c"]


def test_a_track_and_its_untrack_read_in_one_go_renew_nothing_and_tell_nobody(
    manual: Manual,
) -> None:
    outbox = manual.manager.outbox()
    target = Inbox()
    for i in range(100):
        outbox.put(TrackJob(str(i), "t", manual.clock.now, target))
        outbox.put(UntrackJob(str(i), "t", target))
    manual.clock.advance(3 * INTERVAL)

    manual.fire()
    assert manual.table.sent == []
    assert manual.recorder.renewed() == {}
    assert target.got == []


def test_the_outbox_takes_tracks_and_untracks_only() -> None:
    manager = start_link(renewer=LockTable(), keys=QueueKeys("q"), timer=manual_timer())
    try:
        with pytest.raises(TypeError, match="ExtendLocks"):
            manager.outbox().put(ExtendLocks())  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="job_id"):
            manager.outbox().put(TrackJob("", "t"))
    finally:
        stop(manager)


def test_what_a_stopping_manager_did_not_read_is_told_stopped_and_later_puts_refused() -> None:
    manager = start_link(renewer=LockTable(), keys=QueueKeys("q"), timer=manual_timer())
    outbox = manager.outbox()
    target = Inbox()
    reply = outbox.put(TrackJob("j", "t", notify=target))
    stop(manager)

    assert reply.value is None or isinstance(reply.value, Validity)
    wait_for(lambda: target.got, timeout=WAIT_S, what="the target told the manager stopped")
    [told] = target.got
    assert isinstance(told, LockLost)
    assert (told.job_id, told.reason) == ("j", MANAGER_STOPPED)
    with pytest.raises(ManagerStopped):
        outbox.put(TrackJob("k", "t"))


def test_tracks_put_from_many_threads_are_all_read() -> None:
    manager = start_link(renewer=LockTable(), keys=QueueKeys("q"), timer=manual_timer())
    try:
        outbox = manager.outbox()
        go = threading.Barrier(4)

        def put(base: int) -> None:
            go.wait(WAIT_S)
            for i in range(base, base + 2_000):
                outbox.put(TrackJob(str(i), "t"))

        senders = [threading.Thread(target=put, args=(n * 10_000,)) for n in range(4)]
        for sender in senders:
            sender.start()
        for sender in senders:
            sender.join(WAIT_S)
        assert len(get_tracked_job_ids(manager)) == 8_000
    finally:
        stop(manager)


def test_the_timers_tick_alone_reads_the_outbox() -> None:
    # No other message: the manager's own timer wakes it, one interval at most.
    table = LockTable()
    recorder = Recorder()
    manager = start_link(
        renewer=table, keys=QueueKeys("q"), lock_duration=400, **recorder.callbacks()
    )
    try:
        table.held["j"] = "t"
        reply = manager.outbox().put(TrackJob("j", "t", notify=Inbox()))
        wait_for(lambda: "j" in recorder.renewed(), timeout=WAIT_S, what="the job renewed")
        assert isinstance(reply.value, Validity)
    finally:
        stop(manager)


def test_a_track_read_with_its_untrack_still_tells_what_the_books_know(manual: Manual) -> None:
    # Skipping a claim made and ended within one read must never hide a tell.
    outbox = manual.manager.outbox()
    old, again = Inbox(), Inbox()
    manual.table.held["j"] = "new"  # another worker took it: "old" is stolen
    outbox.put(TrackJob("j", "old", manual.clock.now, old))
    manual.clock.advance(INTERVAL + 1)
    manual.fire()
    assert [m.reason for m in old.got] == ["stolen"]

    # The lost lock tracked again (a progress hook) and untracked in one read:
    # the new target hears of the loss all the same.
    outbox.put(TrackJob("j", "old", manual.clock.now, again))
    outbox.put(UntrackJob("j", "old", again))
    manual.fire()
    assert [m.reason for m in again.got] == ["stolen"]


def test_a_new_token_read_with_its_untrack_tells_the_old_claim(manual: Manual) -> None:
    outbox = manual.manager.outbox()
    first, second = Inbox(), Inbox()
    manual.table.held["j"] = "t1"
    outbox.put(TrackJob("j", "t1", manual.clock.now, first))
    manual.fire()
    outbox.put(TrackJob("j", "t2", manual.clock.now, second))
    outbox.put(UntrackJob("j", "t2", second))
    manual.fire()

    [told] = first.got
    assert (told.token, told.reason) == ("t1", "stolen")
    assert second.got == []


def test_a_put_after_a_tell_is_read_after_it(manual: Manual) -> None:
    # The outbox's list is in the mailbox, unread, when the sender tells: what
    # it puts next must not join that list, which is read before the tell.
    outbox = manual.manager.outbox()
    outbox.put(TrackJob("a", "t"))
    manual.manager.tell(TrackJob("b", "t1"))
    manual.manager.tell(UntrackJob("b", "t1"))
    outbox.put(TrackJob("b", "t2"))

    assert sorted(get_tracked_job_ids(manual.manager)) == ["a", "b"]


@pytest.mark.parametrize("run", range(10))
def test_every_put_racing_a_stop_is_refused_or_read_and_its_target_told(run: int) -> None:
    manager = start_link(renewer=LockTable(), keys=QueueKeys("q"), timer=manual_timer())
    outbox = manager.outbox()
    target = Inbox()
    accepted: list[tuple[str, Reply]] = []
    go = threading.Barrier(5)

    def put(base: int) -> None:
        go.wait(WAIT_S)
        for i in range(base, base + 500):
            try:
                reply = outbox.put(TrackJob(str(i), "t", notify=target))
            except ManagerStopped:
                return
            accepted.append((str(i), reply))

    senders = [threading.Thread(target=put, args=(n * 1_000,)) for n in range(4)]
    for sender in senders:
        sender.start()
    go.wait(WAIT_S)
    stop(manager)
    for sender in senders:
        sender.join(WAIT_S)

    assert all(reply.value is not UNREAD for _, reply in accepted)
    wanted = {job_id for job_id, _ in accepted}
    wait_for(
        lambda: wanted <= {m.job_id for m in target.got if m.reason == MANAGER_STOPPED},
        timeout=WAIT_S,
        what="every accepted track's target told the manager stopped",
    )
