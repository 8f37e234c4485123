"""Stops that race other stops, asks and renewals, and what a stopped manager says."""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

import pykka
import pytest
import redis

from actors import (
    ExtendLocks,
    IsTracked,
    LockLost,
    ManagerRef,
    ManagerStopped,
    QueueKeys,
    TrackJob,
    get_stats,
    is_tracked,
    start_link,
    stop,
    track_job,
    untrack_job,
)
from tests.support import (
    INTERVAL_S,
    Inbox,
    LockTable,
    ManualTimers,
    settle,
    start_short,
    wait_for,
)

if TYPE_CHECKING:
    from types import FrameType

    import redis

    from actors import ManagerRef

KEYS = QueueKeys("stop")


def _held_at_the_mailbox(holding: threading.Event, release: threading.Event) -> Any:
    """A trace function that holds a thread just before it puts its message in the mailbox.

    As a preemption at the worst moment would: the manager may stop meanwhile.
    It sets ``holding`` once there, and goes on when ``release`` is set.
    """
    # pykka's reference puts the message, or the manager's own in its place.
    ref_modules = (os.path.join("pykka", "_ref.py"), os.path.join("actors", "ref.py"))

    def tracer(frame: FrameType, event: str, arg: object) -> Any:
        caller = frame.f_back
        if (
            event == "call"
            and frame.f_code.co_name in ("put", "post")
            and caller is not None
            and caller.f_code.co_filename.endswith(ref_modules)
        ):
            holding.set()
            release.wait(20 * INTERVAL_S)
        return None

    return tracer


#: Seconds any answer may take: far above a healthy one, so only a hang trips it.
WAIT_S = 10.0


def test_concurrent_stops_all_return(redis_client: redis.Redis) -> None:
    for _ in range(20):
        manager = start_short(redis_client, KEYS)
        returned: list[bool] = []

        def stop_it(m: ManagerRef = manager, r: list[bool] = returned) -> None:
            stop(m, timeout=5)
            r.append(True)

        threads = [threading.Thread(target=stop_it) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=10)
        assert returned == [True] * 8
        assert not manager.is_alive()


def test_after_stop_tells_warn_once_and_asks_say_stopped(
    redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    manager = start_short(redis_client, KEYS)
    stop(manager)
    with caplog.at_level(logging.WARNING, logger="actors"):
        track_job(manager, "a", "t")
        track_job(manager, "b", "t")
        untrack_job(manager, "a")
        untrack_job(manager, "a", wait=True)
    assert caplog.text.count("is stopped") == 1
    with pytest.raises(ManagerStopped, match="'stop' is stopped"):
        get_stats(manager)
    with pytest.raises(pykka.ActorDeadError):
        is_tracked(manager, "a")
    stop(manager)  # idempotent


def test_an_ask_racing_stop_is_answered(redis_client: redis.Redis) -> None:
    """An ask put after pykka's last pass over the mailbox is answered, never left waiting."""
    manager = start_short(redis_client, KEYS)
    settle(manager)  # the manager's own thread has started
    actor_thread = manager._manager.thread
    assert actor_thread is not None
    holding, release = threading.Event(), threading.Event()
    outcome: list[object] = []

    def ask() -> None:
        sys.settrace(_held_at_the_mailbox(holding, release))
        try:
            untrack_job(manager, "job", wait=True)  # no timeout, as a lease's exit waits
            outcome.append("answered")
        except ManagerStopped as error:
            outcome.append(error)
        finally:
            sys.settrace(None)

    asker = threading.Thread(target=ask, daemon=True)
    asker.start()
    assert holding.wait(20 * INTERVAL_S), "the asker never reached the mailbox"
    # The asker is held on its way into the mailbox; the manager is told to
    # stop meanwhile. Had it stopped and emptied its mailbox for the last time
    # (its thread ended), the message would land where nobody reads: let the
    # asker go on once that has happened, or after a few intervals.
    stopper = threading.Thread(target=stop, args=(manager,), daemon=True)
    stopper.start()
    deadline = time.monotonic() + 5 * INTERVAL_S
    while actor_thread.is_alive() and time.monotonic() < deadline:
        actor_thread.join(INTERVAL_S / 10)
    release.set()

    asker.join(40 * INTERVAL_S)
    stopper.join(40 * INTERVAL_S)
    assert not asker.is_alive(), "the ask was never answered"
    assert not stopper.is_alive()
    assert len(outcome) == 1


def test_a_stop_while_a_renewal_is_on_its_way_tells_every_target_and_fails_every_ask() -> None:
    # Given a manager whose renewal is on its way (held by the server), and a
    # job whose holder asked to be told of its lock's loss
    gated = LockTable(gated=True)
    manager = start_link(renewer=gated, keys=KEYS, timer=ManualTimers())
    target = Inbox()
    track_job(manager, "j", "t", notify=target)
    manager.tell(TrackJob("other", "t", ts=0))
    manager.tell(ExtendLocks())
    assert gated.entered.wait(WAIT_S)
    # (the manager waits for no renewal: it answers at once)
    assert is_tracked(manager, "j", timeout=WAIT_S) is True
    # when it is told to stop, and a query comes behind the stop
    stopped = manager.stop(block=False)
    pending = manager.ask(IsTracked("j"), block=False)
    # then, the renewal still on its way, the stop fails the query as stopped
    # and tells the target that nobody renews its lock
    with pytest.raises(ManagerStopped):
        pending.get(timeout=WAIT_S)
    wait_for(lambda: target.got, WAIT_S, "the target to be told")
    assert target.got == [LockLost("j", "t", "manager_stopped")]
    # and the stop is done once the renewal on its way has landed
    gated.gate.set()
    assert stopped.get(timeout=WAIT_S) is True
    assert not manager.is_alive()
