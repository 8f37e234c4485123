"""A lease's own fence, in both isolation modes: taken once, only while the lock is held."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from actors import BatchOutcome, LockLost, fence, lease
from actors.fencing import FENCE_FIELD
from tests.fencing.test_helpers import KEYS, hold, take_over

if TYPE_CHECKING:
    from collections.abc import Sequence

    import redis

    from actors import ManagerRef
    from tests.conftest import Server, StartManager


@pytest.fixture(params=["thread", "process"])
def manager(
    request: pytest.FixtureRequest, server: Server, start_manager: StartManager
) -> ManagerRef:
    """A manager of each isolation mode, on a URL: it builds its own client."""
    return start_manager(
        connection=server.url, keys=KEYS, lock_duration=10_000, isolation=request.param
    )


def test_a_leases_fence_is_taken_once_and_kept(
    manager: ManagerRef, redis_client: redis.Redis
) -> None:
    # given a job leased by its holder, who reads its fence twice
    token = hold(redis_client)
    with lease(manager, "42", token) as held:
        first, again = held.fence, held.fence
        # and the holder takes another with the helper
        later = fence(redis_client, KEYS, "42", token)
    # then the lease kept its number, and numbers taken after it are larger
    assert first == again < later
    # and once left, the lease still names its own number
    assert held.fence == first


def test_a_stale_lease_gets_no_fence_and_is_lost(
    manager: ManagerRef, redis_client: redis.Redis
) -> None:
    # given a leased job another worker took before the lease read its fence
    token = hold(redis_client)
    with lease(manager, "42", token) as held:
        take_over(redis_client)
        # when the lease reads its fence
        with pytest.raises(LockLost, match="stolen"):
            _ = held.fence
        # then the lease is lost at once, before any tick
        assert held.lost
        assert held.reason == "stolen"
        with pytest.raises(LockLost):
            _ = held.fence


def test_a_lost_lease_takes_no_new_fence(manager: ManagerRef, redis_client: redis.Redis) -> None:
    token = hold(redis_client)
    with lease(manager, "42", token, max_hold=1) as held:
        held.wait(10)
        assert held.reason == "max_hold"
        with pytest.raises(LockLost, match="max_hold"):
            _ = held.fence
    # and no number was spent
    assert redis_client.hget(KEYS.key_prefix + "42", FENCE_FIELD) is None


def test_a_lease_not_entered_has_no_fence(manager: ManagerRef, redis_client: redis.Redis) -> None:
    token = hold(redis_client)
    with pytest.raises(RuntimeError, match="not held"):
        _ = lease(manager, "42", token).fence


def test_a_manager_without_a_client_says_how_to_take_a_fence(
    start_manager: StartManager, redis_client: redis.Redis
) -> None:
    def renewer(job_ids: Sequence[str], tokens: Sequence[str]) -> BatchOutcome:
        return BatchOutcome([], [])

    manager = start_manager(renewer=renewer, keys=KEYS, lock_duration=10_000)
    token = hold(redis_client)
    with lease(manager, "42", token) as held, pytest.raises(RuntimeError, match=r"actors\.fence\("):
        _ = held.fence
