"""Nothing a callback, renewer, notify target, timer or clock does stops the manager.

Nor any other actor of the process: a tick that meets an error, of any
kind, logs it and the next tick runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from typing import TYPE_CHECKING, Any

import pykka
import pytest
import redis

from actors import (
    ManagerRef,
    QueueKeys,
    RedisRenewer,
    get_stats,
    is_tracked,
    start_link,
    track_job,
    untrack_job,
)
from actors.messages import BatchOutcome
from actors.timing import Timing, default_safety_margin
from tests.support import (
    INTERVAL_S,
    TTL,
    Bystander,
    FlakyClock,
    LockTable,
    ManualTimers,
    assert_still_renewing,
    settle,
    start_short,
    take_locks,
    tick,
    wait_for,
    watch_locks,
)

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    import redis

    from actors import ManagerRef

KEYS = QueueKeys("survival")


class _OddRenewer:
    """Renews on the real server, but once answers with ``odd`` instead."""

    def __init__(self, client: redis.Redis, odd: Any) -> None:
        timing = Timing(TTL)
        self._inner = RedisRenewer(client, KEYS, timing, default_safety_margin(timing))
        self._odd = odd
        self.calls = 0

    def __call__(self, job_ids: Sequence[str], tokens: Sequence[str]) -> BatchOutcome:
        self.calls += 1
        outcome = self._inner(job_ids, tokens)
        if self.calls == 1:
            if isinstance(self._odd, BaseException):
                raise self._odd
            return self._odd  # type: ignore[no-any-return]
        return outcome

    def close(self) -> None:
        self._inner.close()


@pytest.fixture
def bystander() -> Iterator[pykka.ActorRef[Any]]:
    ref = Bystander.start()
    yield ref
    ref.stop()


TIMING = Timing(800)


def test_a_timer_that_cannot_start_fails_the_start_and_releases_everything() -> None:
    # Given a timer factory that fails (no thread can be started, say)
    closed = threading.Event()

    class Renewer:
        def __call__(self, job_ids: object, tokens: object) -> object:
            raise AssertionError("never called")

        def close(self) -> None:
            closed.set()

    def broken_timer(fire: object, name: str) -> object:
        raise RuntimeError("no threads left")

    before = set(threading.enumerate())
    # When a manager starts with it, then its start fails, in the caller's thread,
    with pytest.raises(RuntimeError, match="no threads left"):
        start_link(keys=KEYS, renewer=Renewer(), timer=broken_timer)  # type: ignore[arg-type]

    # having closed the renewer, and left no thread and no actor behind
    assert closed.is_set()
    assert [t.name for t in set(threading.enumerate()) - before] == []
    assert pykka.ActorRegistry.get_by_class_name("LockManager") == []


def test_a_callback_raising_system_exit_stops_nothing(redis_client: redis.Redis) -> None:
    bystander = Bystander.start()

    def on_renewed(ids: list[str]) -> None:
        raise SystemExit(1)

    manager = start_short(redis_client, KEYS, on_locks_renewed=on_renewed)
    tokens = take_locks(redis_client, KEYS, ["a"], TTL)
    track_job(manager, "a", tokens["a"])
    seen = watch_locks(redis_client, KEYS, tokens, seconds=3 * TTL / 1000)
    assert seen.missing == set()
    assert get_stats(manager).renewed >= 2
    assert manager.is_alive() and bystander.is_alive()


@pytest.mark.parametrize(
    "odd",
    [
        pytest.param(BatchOutcome(["never-given"], []), id="failed-id-never-given"),
        pytest.param(None, id="not-an-outcome"),
    ],
)
def test_an_odd_renewer_answer_leaves_the_timer_armed(
    redis_client: redis.Redis, odd: object
) -> None:
    """An odd answer from a renewer fails one tick; the timer is re-armed and the next ticks run.

    An id the renewer was never given, or an answer that is not a
    BatchOutcome, fails that tick only: the manager keeps answering and ticking.
    """
    tokens = take_locks(redis_client, KEYS, ["a"], TTL)
    manager = start_link(keys=KEYS, lock_duration=TTL, renewer=_OddRenewer(redis_client, odd))
    track_job(manager, "a", tokens["a"])
    assert_still_renewing(manager, redis_client, KEYS, tokens)


@pytest.mark.parametrize(
    "make_error",
    [asyncio.CancelledError, KeyboardInterrupt],
    ids=["CancelledError", "KeyboardInterrupt"],
)
def test_a_renewer_raising_base_exception_stops_no_actor(
    redis_client: redis.Redis, make_error: type[BaseException]
) -> None:
    """A renewer's BaseException stays inside the tick: every actor of the process lives.

    ``asyncio.CancelledError`` is what a renewer bridged to an event loop
    raises when its call is cancelled; it must not reach pykka, which would stop
    every actor of the process.
    """
    bystander = Bystander.start()
    tokens = take_locks(redis_client, KEYS, ["a"], TTL)
    manager = start_link(
        keys=KEYS, lock_duration=TTL, renewer=_OddRenewer(redis_client, make_error())
    )
    track_job(manager, "a", tokens["a"])
    wait_for(
        lambda: not manager.is_alive() or get_stats(manager).ticks >= 3,
        20 * INTERVAL_S,
        "the first ticks",
    )
    # The manager dies first (pykka then stops the others from its thread).
    assert manager.is_alive(), "the manager was stopped"
    assert bystander.is_alive(), "an unrelated actor was stopped"
    assert_still_renewing(manager, redis_client, KEYS, tokens)


def test_a_notify_target_raising_base_exception_stops_no_actor(
    redis_client: redis.Redis,
) -> None:
    """A notify target's BaseException is caught as any other error: every actor lives.

    Like callbacks, a notify target's ``tell`` is guarded for BaseException:
    its ``asyncio.CancelledError`` never reaches pykka.
    """

    class Raising:
        def tell(self, message: object) -> None:
            raise asyncio.CancelledError

    bystander = Bystander.start()
    other = start_link(connection=redis_client, keys=QueueKeys("other"), lock_duration=TTL)
    tokens = take_locks(redis_client, KEYS, ["a"], TTL)
    manager = start_short(redis_client, KEYS)
    track_job(manager, "a", tokens["a"], notify=Raising())
    track_job(manager, "gone", "token-of-a-lock-that-never-was", notify=Raising())
    wait_for(
        lambda: not manager.is_alive() or not is_tracked(manager, "gone"),
        20 * INTERVAL_S,
        "the loss of 'gone'",
        ignore=(pykka.ActorDeadError,),
    )
    # The job is untracked before its target is told: a tick asked now is
    # answered once every report before it was delivered (the tell landed),
    # and only by a manager whose delivery thread still delivers.
    with contextlib.suppress(pykka.ActorDeadError):
        tick(manager, timeout=20 * INTERVAL_S)
    assert manager.is_alive(), "the manager was stopped"
    assert bystander.is_alive() and other.is_alive(), "unrelated actors were stopped"
    assert_still_renewing(manager, redis_client, KEYS, tokens)


def test_a_notify_target_may_untrack_a_renewed_job_during_the_tick(
    redis_client: redis.Redis,
) -> None:
    """An untrack sent by a notify target's tell, told of a tick's loss, leaves every tick whole.

    The target is told on the manager's delivery thread once the tick's step
    is done; its ``untrack_job(wait=True)`` of a job that tick renewed is
    answered at once (the manager waits for nothing) and leaves the table
    whole: the next ticks run and every other lock stays renewed.
    """
    tokens = take_locks(redis_client, KEYS, ["lost", "renewed"], TTL)
    manager: ManagerRef | None = None

    class UntracksAnother:
        def tell(self, message: object) -> None:
            assert manager is not None
            untrack_job(manager, "renewed", wait=True)

    manager = start_short(redis_client, KEYS)
    # One stamp for both, so that one tick finds both due.
    taken = time.monotonic_ns() // 1_000_000
    track_job(manager, "lost", tokens["lost"], ts=taken, notify=UntracksAnother())
    track_job(manager, "renewed", tokens["renewed"], ts=taken)
    settle(manager)
    redis_client.delete(KEYS.lock("lost"))
    wait_for(lambda: not is_tracked(manager, "lost"), 20 * INTERVAL_S, "the loss of 'lost'")
    tokens.update(take_locks(redis_client, KEYS, ["bystander"], TTL))
    track_job(manager, "bystander", tokens["bystander"])
    assert_still_renewing(manager, redis_client, KEYS, {"bystander": tokens["bystander"]})


def test_a_renewer_whose_close_raises_base_exception_stops_nothing(
    redis_client: redis.Redis, bystander: pykka.ActorRef[Any]
) -> None:
    """A renewer whose ``close()`` raises KeyboardInterrupt at stop stops no other actor."""

    class Renewer:
        def __call__(self, job_ids: list[str], tokens: list[str]) -> Any:
            raise AssertionError("nothing is tracked")

        def close(self) -> None:
            raise KeyboardInterrupt

    other = start_short(redis_client, KEYS)
    manager = start_link(keys=KEYS, renewer=Renewer(), lock_duration=TTL)  # type: ignore[arg-type]

    manager.stop(timeout=5)
    assert not manager.is_alive()
    assert bystander.is_alive() and other.is_alive()


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


def test_a_track_read_while_the_clock_raises_is_kept() -> None:
    # Given a manager whose clock raises at its next reading
    clock, table = FlakyClock(), LockTable()
    manager = start_link(renewer=table, keys=KEYS, clock=clock, timer=ManualTimers())
    clock.fail_next = True
    # when a job stamped by its caller is tracked
    track_job(manager, "j", "t", ts=clock.now)
    # then it is tracked all the same
    assert is_tracked(manager, "j")
