"""Defects a hostile review of the core found, each as a failing test on a real server.

Every test names its defect in its docstring's first line. Locks are short
(``TTL`` ms, so the renew window is ``TTL // 2`` and the interval ``TTL // 4``)
so that a renewal that stops shows within a second; every wait is a multiple
of those durations or a polling deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TYPE_CHECKING, Any

import pykka
import pytest
from pykka.messages import ProxyGetAttr

from actors import (
    ExtendLocks,
    LockLost,
    QueueKeys,
    RedisRenewer,
    ThreadTimer,
    get_stats,
    get_tracked_job_ids,
    is_tracked,
    start_link,
    stop,
    track_job,
    untrack_job,
)
from actors.scripts import BatchOutcome
from tests.hardening.shared import (
    INTERVAL_S,
    TTL,
    WATCH_S,
    Bystander,
    assert_still_renewing,
    start_manager,
)
from tests.support import (
    ManualClock,
    Recorder,
    manual_timer,
    settle,
    take_locks,
    tick,
    wait_for,
    watch_locks,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    import redis

    from actors import ManagerRef

KEYS = QueueKeys("review")


def _manager(client: redis.Redis, **options: Any) -> ManagerRef:
    return start_manager(client, KEYS, **options)


class _Inbox:
    """A notify target that keeps what it is told."""

    def __init__(self) -> None:
        self.got: list[object] = []

    def tell(self, message: object) -> None:
        self.got.append(message)


def _still_renewing(manager: ManagerRef, client: redis.Redis, tokens: dict[str, str]) -> None:
    assert_still_renewing(manager, client, KEYS, tokens)


# -- doors: pykka internals --------------------------------------------------


def test_a_told_proxy_get_attr_of_a_bad_path_kills_the_manager(redis_client: redis.Redis) -> None:
    """Defect: ``tell(ProxyGetAttr(("nope",)))`` passes the reference unchecked and kills the actor.

    pykka handles ProxyGetAttr before ``on_receive``; its AttributeError, with
    no one to answer, goes to ``_handle_failure``, which stops the manager
    (without ``on_stop``: no notify target hears ``manager_stopped``).
    """
    tokens = take_locks(redis_client, KEYS, ["a"], TTL)
    inbox = _Inbox()
    manager = _manager(redis_client)
    track_job(manager, "a", tokens["a"], notify=inbox)
    settle(manager)

    # Refused at the caller would be the right answer; so would being dropped.
    with contextlib.suppress(AttributeError, TypeError, ValueError):
        manager.tell(ProxyGetAttr(attr_path=("no_such_attribute",)))

    _still_renewing(manager, redis_client, tokens)
    assert manager.is_alive()


def test_forged_grid_ticks_push_the_timer_past_every_lock(redis_client: redis.Redis) -> None:
    """Defect: ``ExtendLocks(scheduled=<pending grid time>)`` sent early re-arms the timer later.

    A caller-sent ExtendLocks whose ``scheduled`` equals the pending grid time
    is taken for the timer's tick even before that time comes: jobs are
    stamped in the future and the timer is re-armed one interval after it.
    A burst of such ticks (the grid time read with a ProxyGetAttr, or known
    from a ManualTimer) leaves the timer seconds ahead: every lock expires
    while tracked, with the manager alive and the server healthy.
    """
    armed: list[int] = []

    class Recording:
        """The manager's own timer, telling the test each deadline it is armed with."""

        def __init__(self, fire: Callable[[int], None], name: str) -> None:
            self._timer = ThreadTimer(fire, name)

        def arm(self, deadline_ms: int) -> None:
            armed.append(deadline_ms)
            self._timer.arm(deadline_ms)

        def close(self) -> None:
            self._timer.close()

    tokens = take_locks(redis_client, KEYS, ["a"], TTL)
    manager = _manager(redis_client, timer=Recording)
    track_job(manager, "a", tokens["a"])
    settle(manager)

    for _ in range(50):  # 50 intervals: far past the TTL
        manager.ask(ExtendLocks(armed[-1]))

    seen = watch_locks(redis_client, KEYS, tokens, seconds=WATCH_S, every=0.02)
    assert seen.missing == set(), "the lock expired after forged grid ticks"


# -- the renewer seam --------------------------------------------------------


class _OddRenewer:
    """Renews on the real server, but once answers with ``odd`` instead."""

    def __init__(self, client: redis.Redis, odd: Any) -> None:
        self._inner = RedisRenewer(client, KEYS, TTL, TTL // 4)
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


@pytest.mark.parametrize(
    "odd",
    [
        pytest.param(BatchOutcome(["never-given"], []), id="failed-id-never-given"),
        pytest.param(None, id="not-an-outcome"),
    ],
)
def test_one_odd_renewer_answer_stops_every_later_tick(
    redis_client: redis.Redis, odd: object
) -> None:
    """Defect: any exception in ``_tick`` before the re-arm kills the timer for good.

    ``_apply`` is outside the renewer's try: an id the renewer was never given
    (``token_of[...]`` KeyError) or an answer that is not a BatchOutcome
    raises; ``on_receive`` logs and drops the tick, which never re-arms the
    timer. The manager stays alive and answers queries, yet never ticks again.
    """
    tokens = take_locks(redis_client, KEYS, ["a"], TTL)
    manager = start_link(keys=KEYS, lock_duration=TTL, renewer=_OddRenewer(redis_client, odd))
    track_job(manager, "a", tokens["a"])
    _still_renewing(manager, redis_client, tokens)


@pytest.mark.parametrize(
    "make_error",
    [asyncio.CancelledError, KeyboardInterrupt],
    ids=["CancelledError", "KeyboardInterrupt"],
)
def test_a_renewer_raising_base_exception_stops_every_actor(
    redis_client: redis.Redis, make_error: type[BaseException]
) -> None:
    """Defect: a renewer's BaseException escapes the tick: pykka stops every actor of the process.

    ``_renew`` catches ``Exception`` only, though callbacks are guarded for
    ``BaseException`` for this very reason. ``asyncio.CancelledError`` is what
    a renewer bridged to an event loop raises when its call is cancelled.
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
    _still_renewing(manager, redis_client, tokens)


# -- notify targets ----------------------------------------------------------


def test_a_notify_target_raising_base_exception_stops_every_actor(
    redis_client: redis.Redis,
) -> None:
    """Defect: ``_forget`` guards ``notify.tell`` for ``Exception`` only; BaseException stops all.

    Callbacks are guarded for BaseException; a notify target's tell is not, so
    its ``asyncio.CancelledError`` reaches pykka, which stops every actor.
    """

    class Raising:
        def tell(self, message: object) -> None:
            raise asyncio.CancelledError

    bystander = Bystander.start()
    other = start_link(connection=redis_client, keys=QueueKeys("other"), lock_duration=TTL)
    tokens = take_locks(redis_client, KEYS, ["a"], TTL)
    manager = _manager(redis_client)
    track_job(manager, "a", tokens["a"], notify=Raising())
    track_job(manager, "gone", "token-of-a-lock-that-never-was", notify=Raising())
    wait_for(
        lambda: not manager.is_alive() or not is_tracked(manager, "gone"),
        20 * INTERVAL_S,
        "the loss of 'gone'",
        ignore=(pykka.ActorDeadError,),
    )
    # The job is untracked before its target is told: give the tell time to
    # land (two more ticks, or the manager's death).
    seen = get_stats(manager).ticks if manager.is_alive() else 0
    wait_for(
        lambda: not manager.is_alive() or get_stats(manager).ticks >= seen + 2,
        20 * INTERVAL_S,
        "two more ticks",
        ignore=(pykka.ActorDeadError,),
    )
    assert manager.is_alive(), "the manager was stopped"
    assert bystander.is_alive() and other.is_alive(), "unrelated actors were stopped"
    _still_renewing(manager, redis_client, tokens)


def test_a_notify_target_that_untracks_a_renewed_job_breaks_every_later_tick(
    redis_client: redis.Redis,
) -> None:
    """Defect: an untrack run inside ``_apply`` (by a notify's tell) leaves a stamp with no token.

    ``_apply`` tells the lost jobs' notify targets before it stamps the renewed
    ones. A target that untracks one of those (``untrack_job(wait=True)`` on
    the manager's own thread is answered at once) leaves ``stamps[id]`` with
    no ``tokens[id]``: the next tick's ``due`` raises KeyError, the tick is
    dropped and the timer is never re-armed, so every other lock expires.
    """
    tokens = take_locks(redis_client, KEYS, ["lost", "renewed"], TTL)
    manager: ManagerRef | None = None

    class UntracksAnother:
        def tell(self, message: object) -> None:
            assert manager is not None
            untrack_job(manager, "renewed", wait=True)

    manager = _manager(redis_client)
    # One stamp for both, so that one tick finds both due.
    taken = time.monotonic_ns() // 1_000_000
    track_job(manager, "lost", tokens["lost"], ts=taken, notify=UntracksAnother())
    track_job(manager, "renewed", tokens["renewed"], ts=taken)
    settle(manager)
    redis_client.delete(KEYS.lock("lost"))
    wait_for(lambda: not is_tracked(manager, "lost"), 20 * INTERVAL_S, "the loss of 'lost'")
    tokens.update(take_locks(redis_client, KEYS, ["bystander"], TTL))
    track_job(manager, "bystander", tokens["bystander"])
    _still_renewing(manager, redis_client, {"bystander": tokens["bystander"]})


# -- tracking again ----------------------------------------------------------


def test_tracking_again_with_the_same_token_forgets_the_notify_target(
    redis_client: redis.Redis,
) -> None:
    """Defect: with a manager ``max_hold``, re-tracking (same token) drops the job's notify target.

    ``_on_track`` builds ``Watch(None, deadline)`` for every track once the
    manager has a ``max_hold``, and ``JobTable.track`` stores it over the old
    one: a progress hook that re-tracks silently unsubscribes the lease or job
    actor that asked to hear of a loss. The lock is then lost, the job
    untracked, and its holder never told.
    """
    tokens = take_locks(redis_client, KEYS, ["a"], TTL)
    inbox = _Inbox()
    manager = _manager(redis_client, max_hold=600_000)
    track_job(manager, "a", tokens["a"], notify=inbox)
    track_job(manager, "a", tokens["a"])  # a progress hook
    settle(manager)
    redis_client.set(KEYS.lock("a"), "somebody-else")
    wait_for(lambda: not is_tracked(manager, "a"), 20 * INTERVAL_S, "the loss of 'a'")
    assert inbox.got == [LockLost("a", tokens["a"], "stolen")]


def test_tracking_again_with_the_same_token_slides_max_hold(redis_client: redis.Redis) -> None:
    """Defect: re-tracking with the same token restarts the ``max_hold`` clock, so it never ends.

    The stamp is kept (as the contract asks) but the hold deadline is computed
    from the new message's ``ts``: a progress hook that re-tracks more often
    than ``max_hold`` keeps a job renewed for ever.
    """
    clock, timers = ManualClock(), manual_timer()
    lock_duration, max_hold = 30_000, 1_000
    tokens = take_locks(redis_client, KEYS, ["a"], lock_duration)
    recorder = Recorder()
    manager = recorder.start(
        redis_client,
        KEYS,
        lock_duration=lock_duration,
        max_hold=max_hold,
        clock=clock,
        timer=timers,
    )
    track_job(manager, "a", tokens["a"])
    settle(manager)
    clock.advance(max_hold * 6 // 10)
    track_job(manager, "a", tokens["a"])  # a progress hook
    settle(manager)
    clock.advance(max_hold * 6 // 10)  # 1.2 x max_hold since the lock was taken
    tick(manager)
    assert [(lost.job_id, lost.reason) for lost in recorder.lost()] == [("a", "max_hold")]
    assert get_tracked_job_ids(manager) == []


# -- callbacks calling back in ------------------------------------------------


def test_a_proxy_call_from_a_callback_blocks_the_manager(redis_client: redis.Redis) -> None:
    """Defect: ``manager.proxy().stop().get()`` from a callback waits for the manager's own thread.

    The reference answers queries asked from the manager's thread at once, but
    passes every other ask (a proxy ``stop``, a ProxyGetAttr) to pykka, whose
    future can only be set by the thread that is waiting on it: without a
    timeout the manager hangs for ever.
    """
    tokens = take_locks(redis_client, KEYS, ["a"], TTL)
    budget = 10 * INTERVAL_S
    outcome: dict[str, object] = {}
    manager: ManagerRef | None = None

    def on_renewed(ids: list[str]) -> None:
        if outcome:
            return
        assert manager is not None
        started = time.monotonic()
        try:
            outcome["value"] = manager.proxy().stop().get(timeout=budget)
        except Exception as exc:  # anything but a wait will do
            outcome["value"] = exc
        outcome["elapsed"] = time.monotonic() - started

    manager = _manager(redis_client, on_locks_renewed=on_renewed)
    track_job(manager, "a", tokens["a"])
    wait_for(lambda: "elapsed" in outcome, budget + WATCH_S, "the callback")
    assert not isinstance(outcome["value"], pykka.Timeout), "the call waited for itself"
    assert isinstance(outcome["elapsed"], float) and outcome["elapsed"] < budget / 2


# -- the clock seam -----------------------------------------------------------


def test_a_clock_in_float_milliseconds_is_accepted_and_never_ticks(
    redis_client: redis.Redis,
) -> None:
    """Defect: ``clock=`` is only checked for being callable; a float clock stops every tick.

    ``clock=lambda: time.monotonic() * 1000`` starts fine; the timer thread's
    first ``ExtendLocks(float)`` raises TypeError there, and ThreadTimer takes
    any exception for a dead manager and exits. Nothing ever renews, and the
    only error a caller sees blames ``ts``, which it never passed.
    """
    tokens = take_locks(redis_client, KEYS, ["a"], TTL)
    try:
        manager = _manager(redis_client, clock=lambda: time.monotonic() * 1000)
    except (TypeError, ValueError) as exc:
        assert "clock" in str(exc)
        return
    track_job(manager, "a", tokens["a"], ts=time.monotonic_ns() // 1_000_000)
    _still_renewing(manager, redis_client, tokens)
    stop(manager)
