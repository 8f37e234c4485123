"""Stopping managers: from their own callbacks, from each other's, and racing."""

from __future__ import annotations

import asyncio
import threading
from typing import TYPE_CHECKING

import pykka
import pytest

from actors import ExtendLocks, QueueKeys, aio, start_link, stop, track_job
from tests.support import take_locks, wait_for

if TYPE_CHECKING:
    from collections.abc import Callable

    import redis

    from actors import ManagerRef

TTL = 1000
#: Longest wait for something an idle manager does at once, on a loaded machine.
PROMPT_S = 5.0
#: The timeout a callback's own stop is given: a deadlock shows as its Timeout.
STOP_TIMEOUT_S = 3 * PROMPT_S


def _stop_everything(_: ManagerRef) -> object:
    return pykka.ActorRegistry.stop_all(timeout=STOP_TIMEOUT_S)


def _stop_the_other(other: ManagerRef) -> object:
    return asyncio.run(aio.stop(other, timeout=STOP_TIMEOUT_S))


def _manager_threads(before: set[threading.Thread]) -> list[threading.Thread]:
    return [t for t in set(threading.enumerate()) - before if t.name.startswith("LockManager")]


@pytest.mark.parametrize("stopping", [_stop_everything, _stop_the_other])
def test_managers_whose_callbacks_stop_each_other_all_stop(
    redis_client: redis.Redis, stopping: Callable[[ManagerRef], object]
) -> None:
    # Given two managers whose callbacks run at the same time, and each
    # stops the other (or every actor, with pykka's stop_all)
    before = set(threading.enumerate())
    both_inside = threading.Barrier(2)
    managers: dict[str, ManagerRef] = {}
    outcomes: dict[str, object] = {}

    def on_renewed(name: str, other: str) -> Callable[[list[str]], None]:
        def callback(_: list[str]) -> None:
            if name in outcomes:
                return
            outcomes[name] = None
            try:
                both_inside.wait(PROMPT_S)
                outcomes[name] = stopping(managers[other])
            except Exception as error:
                outcomes[name] = error

        return callback

    for name, other in (("a", "b"), ("b", "a")):
        keys = QueueKeys(f"stop-{name}")
        managers[name] = start_link(
            connection=redis_client,
            keys=keys,
            lock_duration=TTL,
            on_locks_renewed=on_renewed(name, other),
        )
        tokens = take_locks(redis_client, keys, ["j"], TTL)
        track_job(managers[name], "j", tokens["j"], ts=managers[name].clock() - TTL)

    # when both renew (and so call back) at once
    for manager in managers.values():
        manager.tell(ExtendLocks())

    # then neither waited for the other: both stopped, no thread is left
    wait_for(lambda: len(outcomes) == 2 and None not in outcomes.values(), 2 * PROMPT_S, "both")
    assert not any(isinstance(outcome, Exception) for outcome in outcomes.values()), outcomes
    wait_for(lambda: not _manager_threads(before), PROMPT_S, "the managers' threads to end")
    assert not any(manager.is_alive() for manager in managers.values())


def test_of_racing_stops_exactly_one_returns_true(redis_client: redis.Redis) -> None:
    racers = 8
    for _ in range(20):
        # Given a running manager, and several threads that stop it at once
        manager = start_link(connection=redis_client, keys=QueueKeys("race"), lock_duration=TTL)
        start = threading.Barrier(racers)
        returned: list[bool] = []

        def racer(
            by_ref: bool,
            m: ManagerRef = manager,
            s: threading.Barrier = start,
            r: list[bool] = returned,
        ) -> None:
            s.wait(PROMPT_S)
            r.append(m.stop(timeout=PROMPT_S) if by_ref else stop(m, timeout=PROMPT_S))

        # (half through the helper, half through the reference)
        threads = [threading.Thread(target=racer, args=(n % 2 == 0,)) for n in range(racers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(2 * PROMPT_S)

        # then every call returned once it was stopped, and one alone says it stopped it
        assert sorted(returned) == [False] * (racers - 1) + [True]
        assert not manager.is_alive()
        assert stop(manager) is False


def test_a_stop_without_waiting_is_true_for_the_first_call_only(
    redis_client: redis.Redis,
) -> None:
    manager = start_link(connection=redis_client, keys=QueueKeys("race"), lock_duration=TTL)

    first = manager.stop(block=False)
    second = manager.stop(block=False)

    assert (first.get(timeout=PROMPT_S), second.get(timeout=PROMPT_S)) == (True, False)
    assert manager.stop(block=False).get(timeout=PROMPT_S) is False
