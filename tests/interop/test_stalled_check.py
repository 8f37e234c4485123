"""BullMQ's own stalled check, in Python and in Node.js, against locks our manager renews.

Each test runs once per peer (bullmq-py, BullMQ for Node.js) and per engine.
The peer's worker takes jobs by hand with a token, so BullMQ sets their locks
and nobody but our manager renews them; the peer's stalled check is the judge.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pytest

from actors import get_stats, stop, track_job, untrack_job
from tests.interop.peers import HOLD_S, LOCK_MS, check_for, check_until_stalled, stall_count

if TYPE_CHECKING:
    import redis

    from actors import ManagerRef, QueueKeys
    from tests.interop.peers import Peer

pytestmark = pytest.mark.both_engines

#: A lock BullMQ set at fetch time is gone after this, unless renewed.
LOCK_S = LOCK_MS / 1000


def test_tracked_job_outlives_stalled_checks_and_is_recovered_once_untracked(
    peer: Peer,
    manager: ManagerRef,
    engine_client: redis.Redis,
    keys: QueueKeys,
) -> None:
    # Given a job that BullMQ's worker took by hand, tracked by our manager.
    (job_id,) = peer.add(1)
    (held,) = peer.fetch(1)
    fetched_at = time.monotonic()
    assert held.id == job_id
    track_job(manager, held.id, held.token)

    # When BullMQ's stalled check runs over three lock durations.
    checks = check_for(peer, engine_client, keys, HOLD_S)

    # Then checks ran after the fetch-time lock would have expired (one marks,
    # the next moves), yet the job is still active under the same token and
    # was never reported stalled.
    assert checks.ran_after(fetched_at + LOCK_S) >= 2, checks
    assert checks.stalled == []
    assert stall_count(engine_client, keys, job_id) == 0
    assert peer.states([job_id]) == {job_id: "active"}
    assert engine_client.get(keys.lock(job_id)) == held.token.encode()
    stats = get_stats(manager)
    assert stats.lost == 0
    assert stats.renewed >= int(HOLD_S // LOCK_S)

    # When the manager lets it go.
    untrack_job(manager, job_id)
    recovery = check_until_stalled(peer, engine_client, keys, [job_id])

    # Then once its lock expires, BullMQ reports it stalled, once, and moves it back to wait.
    assert recovery.stalled == [job_id]
    assert stall_count(engine_client, keys, job_id) == 1
    assert peer.states([job_id]) == {job_id: "waiting"}
    assert not engine_client.exists(keys.lock(job_id))


def test_only_tracked_jobs_stay_active_and_each_is_released_when_dropped(
    peer: Peer,
    manager: ManagerRef,
    engine_client: redis.Redis,
    keys: QueueKeys,
) -> None:
    # Given six jobs taken by hand, of which our manager tracks every other one.
    ids = peer.add(6)
    held = peer.fetch(6)
    fetched_at = time.monotonic()
    assert sorted(job.id for job in held) == sorted(ids)
    tracked, untracked = held[0::2], held[1::2]
    for job in tracked:
        track_job(manager, job.id, job.token)

    # When BullMQ's stalled check runs over three lock durations.
    checks = check_for(
        peer, engine_client, keys, HOLD_S, until_stalled=[job.id for job in untracked]
    )

    # Then each untracked job was reported stalled exactly once and is waiting
    # again, while every tracked one is still active and was never reported.
    assert checks.ran_after(fetched_at + LOCK_S) >= 2, checks
    assert sorted(checks.stalled) == sorted(job.id for job in untracked)
    assert peer.states(ids) == {
        **{job.id: "active" for job in tracked},
        **{job.id: "waiting" for job in untracked},
    }
    assert [stall_count(engine_client, keys, job.id) for job in tracked] == [0] * len(tracked)
    assert get_stats(manager).lost == 0

    # When the manager drops one of its jobs.
    dropped, *kept = tracked
    untrack_job(manager, dropped.id)
    recovery = check_until_stalled(peer, engine_client, keys, [dropped.id])

    # Then only that one is recovered; the others keep their lock and their state.
    assert recovery.stalled == [dropped.id]
    assert peer.states([job.id for job in tracked]) == {
        dropped.id: "waiting",
        **{job.id: "active" for job in kept},
    }
    for job in kept:
        assert engine_client.get(keys.lock(job.id)) == job.token.encode()

    # When the manager stops.
    stop(manager)
    release = check_until_stalled(peer, engine_client, keys, [job.id for job in kept])

    # Then its remaining jobs are recovered too, each once, and every job waits.
    assert sorted(release.stalled) == sorted(job.id for job in kept)
    assert set(peer.states(ids).values()) == {"waiting"}
