"""A lease's own rules: its arguments, its life, and a manager that stops under it.

The manager here renews through an in-memory lock table and ticks only when
a test asks (``timer=ManualTimers()``), so each step is finished when the test
looks; the tests that need a server are in the other files of this tier.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import TYPE_CHECKING, Any

import pytest

import actors
from actors import ExtendLocks, Lease, LockLost, ManagerRef, QueueKeys, TrackJob, aio, lease
from actors.lock_manager import STOP_RENEWAL_S
from tests.leases.tools import CountingLease
from tests.support import LockTable, ManualClock, ManualTimers, settle, tick

if TYPE_CHECKING:
    from tests.conftest import StartManager

KEYS = QueueKeys("lease")
THRESHOLD_MS = actors.Timing().threshold


@pytest.fixture
def table() -> LockTable:
    return LockTable()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def manager(table: LockTable, clock: ManualClock, start_manager: StartManager) -> ManagerRef:
    return start_manager(renewer=table, keys=KEYS, clock=clock, timer=ManualTimers())


def _due_tick(manager: ManagerRef, clock: ManualClock) -> None:
    clock.advance(THRESHOLD_MS + 1)
    tick(manager)


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        (("", "t"), ValueError, "job_id"),
        ((7, "t"), TypeError, "job_id"),
        (("j", ""), ValueError, "token"),
        (("j", b"t"), TypeError, "token"),
        (("j", "\ud800"), ValueError, "token"),
        (("j", "t", 0), ValueError, "max_hold"),
        (("j", "t", "100"), TypeError, "max_hold"),
        (("j", "t", 2**31), ValueError, "max_hold"),
    ],
)
def test_bad_arguments_raise_at_the_caller(
    manager: ManagerRef, args: tuple[Any, ...], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        lease(manager, *args)
    settle(manager)
    assert actors.get_active_job_count(manager) == 0


def test_a_lease_needs_a_manager_reference() -> None:
    with pytest.raises(TypeError, match="manager must be the reference"):
        lease("redis://localhost", "j", "t")  # type: ignore[arg-type]


def test_the_lease_tracks_while_held_and_untracks_before_leaving(
    manager: ManagerRef, table: LockTable, clock: ManualClock
) -> None:
    table.held["j"] = "t"
    held = lease(manager, "j", "t")
    assert not actors.is_tracked(manager, "j")  # nothing happens until it is entered
    with held as same:
        assert same is held
        assert actors.is_tracked(manager, "j")
        _due_tick(manager, clock)
        assert not held.lost and held.reason is None
        held.check()
        assert held.wait(0) is False
    # No tick can see the lock after the block: it is untracked already.
    assert not actors.is_tracked(manager, "j")
    assert held.wait() is False  # left with its lock held: nothing to wait for
    assert actors.get_stats(manager).renewed == 1


def test_an_error_in_the_block_passes_through_and_the_job_is_untracked(
    manager: ManagerRef, table: LockTable
) -> None:
    table.held["j"] = "t"
    with pytest.raises(KeyError), lease(manager, "j", "t"):
        raise KeyError("the job failed")
    assert not actors.is_tracked(manager, "j")


def test_leaving_after_a_loss_never_raises(
    manager: ManagerRef, table: LockTable, clock: ManualClock
) -> None:
    table.held["j"] = "t"
    with lease(manager, "j", "t") as held:
        table.held["j"] = "thief"
        _due_tick(manager, clock)
        assert held.reason == "stolen"
    with pytest.raises(LockLost) as raised:
        held.check()
    assert raised.value == LockLost("j", "t", "stolen")
    assert str(raised.value) == (
        "the lock of job 'j' is lost (stolen): the lock holds another worker's token "
        f"(found {THRESHOLD_MS + 1} ms after its last renewal or taking)"
    )


def test_a_lease_is_entered_once(manager: ManagerRef) -> None:
    held = lease(manager, "j", "t")
    with pytest.raises(RuntimeError, match="not entered"):
        held.wait(0)
    with pytest.raises(RuntimeError, match="not entered"):
        asyncio.run(held.wait_async(0))
    with held, pytest.raises(RuntimeError, match="already entered"), held:
        pass
    with pytest.raises(RuntimeError, match="already entered"), held:
        pass


def test_wait_times_out_while_the_lock_is_held(manager: ManagerRef) -> None:
    async def main(held: Lease) -> bool:
        return await held.wait_async(0.01)

    with lease(manager, "j", "t") as held:
        assert held.wait(0.01) is False
        assert asyncio.run(main(held)) is False
        assert not held.lost


def test_the_manager_max_hold_applies_unless_the_lease_sets_its_own(
    table: LockTable, clock: ManualClock
) -> None:
    manager = actors.start_link(
        renewer=table, keys=KEYS, clock=clock, timer=ManualTimers(), max_hold=1000
    )
    table.held.update({"short": "t", "default": "t"})
    with lease(manager, "short", "t", max_hold=10) as short, lease(manager, "default", "t") as dflt:
        assert (short.max_hold, dflt.max_hold) == (10, None)
        clock.advance(10)
        tick(manager)
        assert (short.reason, dflt.reason) == ("max_hold", None)
        clock.advance(990)
        tick(manager)
        assert dflt.reason == "max_hold"


def test_messages_for_other_locks_are_ignored(
    manager: ManagerRef, caplog: pytest.LogCaptureFixture
) -> None:
    with lease(manager, "j", "t") as held, caplog.at_level(logging.WARNING, "actors.lease"):
        held.tell(LockLost("j", "an older token", "stolen"))
        held.tell(LockLost("k", "t", "stolen"))
        held.tell("hello")
        assert not held.lost
    assert len(caplog.records) == 3
    # Once left, even its own loss changes nothing.
    held.tell(LockLost("j", "t", "stolen"))
    assert not held.lost


def test_the_first_loss_is_kept(manager: ManagerRef) -> None:
    with lease(manager, "j", "t") as held:
        held.tell(LockLost("j", "t", "max_hold"))
        held.tell(LockLost("j", "t", "stolen"))
        assert held.reason == "max_hold"


def test_a_stopped_manager_means_a_lost_lock_at_once(
    manager: ManagerRef, caplog: pytest.LogCaptureFixture
) -> None:
    actors.stop(manager)
    with caplog.at_level(logging.WARNING), lease(manager, "j", "t") as held:
        assert held.lost and held.reason == "manager_stopped"
        assert held.wait() is True
        with pytest.raises(LockLost, match="manager_stopped"):
            held.check()
    # Nothing to untrack: no "is stopped" warning for the lease's exit.
    assert caplog.records == []


def test_a_manager_that_stops_while_the_job_runs_tells_it(
    manager: ManagerRef, table: LockTable, clock: ManualClock
) -> None:
    table.held["j"] = "t"
    learned: list[bool] = []
    with CountingLease(manager, "j", "t") as held:
        waiter = threading.Thread(target=lambda: learned.append(held.wait(10)))
        waiter.start()
        _due_tick(manager, clock)
        actors.stop(manager)
        waiter.join(10)
    assert learned == [True]
    assert held.told == [LockLost("j", "t", "manager_stopped")]


def _stopping(gated: LockTable) -> ManagerRef:
    """A manager told to stop while its renewal is on its way (its stop waits for it)."""
    manager = actors.start_link(renewer=gated, keys=KEYS, timer=ManualTimers())
    manager.tell(TrackJob("other", "t", ts=0))
    manager.tell(ExtendLocks())
    assert gated.entered.wait(10)
    manager.stop(block=False)
    return manager


def test_a_lease_entered_on_a_stopping_manager_learns_the_manager_stopped_at_entry() -> None:
    # Given a manager that is stopping, waiting for the renewal on its way
    gated = LockTable(gated=True)
    manager = _stopping(gated)
    try:
        # when a job enters a lease on it
        with CountingLease(manager, "j", "t") as held:
            # then the entry returns, the lease lost: nobody will renew its lock
            assert held.reason == "manager_stopped"
            assert held.wait(0) is True
            with pytest.raises(LockLost):
                held.check()
    finally:
        gated.gate.set()
        actors.stop(manager)
    # and the job was told so once, if the stop found the track in its mailbox
    assert held.losses() in ([], [LockLost("j", "t", "manager_stopped")])


def test_an_async_lease_entered_on_a_stopping_manager_learns_the_manager_stopped() -> None:
    gated = LockTable(gated=True)
    manager = _stopping(gated)

    async def main() -> tuple[bool, Lease]:
        async with lease(manager, "j", "t") as held:
            return await held.wait_async(0), held

    try:
        learned, held = asyncio.run(main())
    finally:
        gated.gate.set()
        actors.stop(manager)
    assert learned is True
    assert held.reason == "manager_stopped"


def test_leaving_a_lease_on_a_stopping_manager_waits_for_no_renewal() -> None:
    gated = LockTable(gated=True)
    manager = _stopping(gated)
    held = lease(manager, "j", "t")
    started = time.monotonic()
    try:
        with held:
            pass
        # Entered and left while the renewal is held: the stop would wait that long.
        assert time.monotonic() - started < STOP_RENEWAL_S / 2
    finally:
        gated.gate.set()
    assert held.reason == "manager_stopped"


def test_async_with_tracks_and_untracks(
    manager: ManagerRef, table: LockTable, clock: ManualClock
) -> None:
    table.held["j"] = "t"

    async def main() -> Lease:
        async with lease(manager, "j", "t") as held:
            assert await aio.is_tracked(manager, "j")
            table.held["j"] = "thief"
            await asyncio.to_thread(_due_tick, manager, clock)
            assert await held.wait_async() is True
        return held

    held = asyncio.run(main())
    assert held.reason == "stolen"
    assert not actors.is_tracked(manager, "j")


def test_a_waiting_task_wakes_when_the_lease_is_left(manager: ManagerRef) -> None:
    async def main() -> bool:
        async with lease(manager, "j", "t") as held:
            waiting = asyncio.ensure_future(held.wait_async())
            await asyncio.sleep(0)
        return await asyncio.wait_for(waiting, 10)

    assert asyncio.run(main()) is False


def test_a_lease_repr_says_its_state(manager: ManagerRef) -> None:
    held = lease(manager, "j", "t")
    assert repr(held) == "Lease('j', state=new, reason=None)"
    with held:
        held.tell(LockLost("j", "t", "expired"))
        assert repr(held) == "Lease('j', state=held, reason='expired')"
    assert repr(held) == "Lease('j', state=closed, reason='expired')"
