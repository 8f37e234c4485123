"""Defects a review found in who is told of a lost lock, on each engine's real server.

Every test names its defect in its docstring's first line and fails while the
defect is there. Locks are short (``TTL`` ms: renew window ``TTL // 2``,
interval ``TTL // 4``); a lock somebody waits on is checked at every tick, so
a loss is told within one interval. Every wait polls, with a deadline that is
a multiple of those durations.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import pytest

from actors import LockLost, QueueKeys, is_tracked, lease, start_link, stop, track_job
from tests.support import settle, take_locks, wait_for, wait_ticks

if TYPE_CHECKING:
    import redis

    from actors import ManagerRef

KEYS = QueueKeys("review-notify")
TTL = 400  # ms: renew window 200 ms, interval 100 ms
INTERVAL_S = TTL / 4 / 1000
#: The most a loss may take to be told, with room for a loaded machine: ten
#: intervals where one is the rule.
LEARN_S = 10 * INTERVAL_S
#: A ``max_hold`` off the tick grid, in ms: its deadline falls between two ticks.
MAX_HOLD = 3 * TTL // 4 + 7


def _manager(client: redis.Redis, **options: Any) -> ManagerRef:
    """A manager on ``client``'s server, with a client of its own whose timeouts fit ``TTL``."""
    kwargs = client.connection_pool.connection_kwargs
    url = f"redis://{kwargs['host']}:{kwargs['port']}/{kwargs.get('db', 0)}"
    return start_link(connection=url, keys=KEYS, lock_duration=TTL, **options)


class _Inbox:
    """A notify target (a job actor, say) that keeps what it is told."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._got: list[object] = []

    def tell(self, message: object) -> None:
        with self._lock:
            self._got.append(message)

    @property
    def got(self) -> list[object]:
        """Every message told so far, in order."""
        with self._lock:
            return list(self._got)


def _steal(client: redis.Redis, job_id: str) -> None:
    """Another worker takes the job: its lock now holds that worker's token."""
    client.set(KEYS.lock(job_id), "another-worker", px=10 * TTL)


def _untracked(manager: ManagerRef, job_id: str) -> None:
    # The manager tells whoever waits in the tick that untracks the job, so
    # once a later query sees it gone, everybody has been told.
    wait_for(lambda: not is_tracked(manager, job_id), LEARN_S, f"the loss of {job_id!r}")


def test_a_lease_is_not_told_once_its_lock_is_tracked_with_another_target(
    engine_client: redis.Redis,
) -> None:
    """Defect: ``track_job(..., notify=actor)`` of a leased lock (same token) silences the lease.

    The manager keeps one target per lock and the newest replaces the older:
    the lock is then stolen, the actor is told, and the lease says
    ``lost=False`` and ``check()`` passes while another worker owns the job.
    """
    manager = _manager(engine_client)
    token = take_locks(engine_client, KEYS, ["j"], TTL)["j"]
    actor = _Inbox()
    with lease(manager, "j", token) as held:
        track_job(manager, "j", token, notify=actor)  # the same lock, another target
        settle(manager)
        _steal(engine_client, "j")
        assert held.wait(LEARN_S), "the lease was never told its lock was stolen"
        assert held.reason == "stolen"
        with pytest.raises(LockLost):
            held.check()
        wait_for(lambda: actor.got, LEARN_S, "the actor to be told")
    assert actor.got == [LockLost("j", token, "stolen")]


def test_every_target_of_a_lock_is_told_once_however_often_it_asked(
    engine_client: redis.Redis,
) -> None:
    """Defect: of two targets of one lock, only the one that asked last is told of its loss.

    ``a`` asks, ``b`` asks, ``a`` asks again and a progress hook re-tracks
    without a target: each of ``a`` and ``b`` must hear of the loss exactly
    once (asking again adds nothing), and nothing more in the ticks after.
    """
    manager = _manager(engine_client)
    token = take_locks(engine_client, KEYS, ["j"], TTL)["j"]
    a, b = _Inbox(), _Inbox()
    track_job(manager, "j", token, notify=a)
    track_job(manager, "j", token, notify=b)
    track_job(manager, "j", token, notify=a)
    track_job(manager, "j", token)  # a progress hook
    settle(manager)

    _steal(engine_client, "j")
    _untracked(manager, "j")
    wait_ticks(manager, 2, LEARN_S)

    lost = LockLost("j", token, "stolen")
    assert (a.got, b.got) == ([lost], [lost])


def test_a_new_token_tells_every_target_of_the_old_lock(engine_client: redis.Redis) -> None:
    """Defect: when a new token replaces a lock with two targets, only the last one is told.

    The job was taken again (another run holds it now): each target of the
    old lock must hear ``"stolen"`` with the old token, at once. The new lock
    starts afresh: only its own target hears of its loss later.
    """
    manager = _manager(engine_client)
    old = take_locks(engine_client, KEYS, ["j"], TTL)["j"]
    a, b, c = _Inbox(), _Inbox(), _Inbox()
    track_job(manager, "j", old, notify=a)
    track_job(manager, "j", old, notify=b)
    engine_client.set(KEYS.lock("j"), "new-token", px=TTL)  # the job is taken again
    track_job(manager, "j", "new-token", notify=c)
    settle(manager)

    replaced = LockLost("j", old, "stolen")
    assert (a.got, b.got, c.got) == ([replaced], [replaced], [])
    assert is_tracked(manager, "j")

    _steal(engine_client, "j")
    _untracked(manager, "j")
    assert (a.got, b.got, c.got) == ([replaced], [replaced], [LockLost("j", "new-token", "stolen")])


def test_max_hold_tells_every_target(engine_client: redis.Redis) -> None:
    """Defect: a lock with two targets let go at its ``max_hold`` tells only the last one.

    The deadline is the first track's (adding a target does not slide it).
    """
    manager = _manager(engine_client)
    token = take_locks(engine_client, KEYS, ["j"], 10 * TTL)["j"]
    a, b = _Inbox(), _Inbox()
    track_job(manager, "j", token, notify=a, max_hold=MAX_HOLD)
    track_job(manager, "j", token, notify=b, max_hold=MAX_HOLD)

    wait_for(
        lambda: not is_tracked(manager, "j"),
        MAX_HOLD / 1000 + LEARN_S,
        "the job to be let go at its max_hold",
    )

    lost = LockLost("j", token, "max_hold")
    assert (a.got, b.got) == ([lost], [lost])


def test_a_stopping_manager_tells_every_target(engine_client: redis.Redis) -> None:
    """Defect: a manager that stops tells only the last target of each lock.

    Nobody renews the lock from then on: each target must hear
    ``"manager_stopped"``, once.
    """
    manager = _manager(engine_client)
    token = take_locks(engine_client, KEYS, ["j"], TTL)["j"]
    a, b = _Inbox(), _Inbox()
    track_job(manager, "j", token, notify=a)
    track_job(manager, "j", token, notify=b)
    settle(manager)

    stop(manager)

    lost = LockLost("j", token, "manager_stopped")
    assert (a.got, b.got) == ([lost], [lost])
