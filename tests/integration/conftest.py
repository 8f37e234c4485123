"""Fixtures of the integration tier: managers on a test-driven clock."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from actors import QueueKeys, Timing, track_job
from actors.embedded import free_port
from tests.support import ManualClock, ManualTimers, manual_timer, new_token, settle, take_locks

if TYPE_CHECKING:
    from actors import ManagerRef
    from tests.conftest import StartManager

#: The lock duration of the managers ``start_manual`` starts, in ms.
LOCK_DURATION = 30000
#: Age after which a job is due, in ms: lock_renew_time // 2 with the default renew time.
THRESHOLD = Timing(LOCK_DURATION).threshold


@pytest.fixture
def timers() -> ManualTimers:
    """The timers of the managers ``start_manual`` starts: they never fire."""
    return manual_timer()


@pytest.fixture
def start_manual(timers: ManualTimers, start_manager: StartManager) -> StartManager:
    """Start managers on a test-driven clock whose ticks the test sends."""

    def start(
        connection: redis.Redis | str, keys: QueueKeys, clock: ManualClock, **options: Any
    ) -> ManagerRef:
        return start_manager(
            connection=connection,
            keys=keys,
            lock_duration=LOCK_DURATION,
            clock=clock,
            timer=timers,
            **options,
        )

    return start


def queue_keys() -> QueueKeys:
    """A queue of its own per test, so spans, points and records of other managers never match."""
    return QueueKeys(f"obs-{uuid.uuid4().hex[:8]}")


def hold(client: redis.Redis, keys: QueueKeys, job_id: str, ttl_ms: int = 20000) -> str:
    """Take ``job_id``'s lock for ``ttl_ms``; return its token."""
    return take_locks(client, keys, [job_id], ttl_ms)[job_id]


def dead_client() -> redis.Redis:
    """A client of a port nobody listens on: every command fails at once."""
    return redis.Redis(
        port=free_port(),
        socket_timeout=0.5,
        socket_connect_timeout=0.5,
        retry=Retry(NoBackoff(), 0),
    )


def on_a_dead_server(start_manual: StartManager, *job_ids: str) -> tuple[QueueKeys, ManagerRef]:
    """A manual manager on :func:`dead_client`, tracking ``job_ids``, each due at the next tick."""
    keys, clock = queue_keys(), ManualClock()
    manager = start_manual(dead_client(), keys, clock)
    for job_id in job_ids:
        track_job(manager, job_id, new_token())
    settle(manager)
    clock.advance(THRESHOLD + 1)
    return keys, manager
