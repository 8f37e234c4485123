"""A holder that dies without untracking: its claim ends at the next tick, its lock is handed on.

An Erlang monitor sees a watched process's ``DOWN``; a pykka job actor that
stops, or crashes, leaves its ``notify`` ref dead (``is_alive()`` answers
``False``). Its claim ends then, with a WARNING naming the job, and a lock no
claim holds any more is deleted if it still holds its token, so the next
stalled check hands the job on instead of never. Both modes.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import pykka
import pytest
import redis

from actors import QueueKeys, get_active_job_count, is_tracked, start_link, stop, track_job
from tests.support import Server, take_locks, wait_for

KEYS = QueueKeys("dead-holders")
LOCK_MS = 1000
#: Seconds for a few ticks to come, with a margin for a loaded machine.
SOON_S = 10 * LOCK_MS / 1000


class Job(pykka.ThreadingActor):
    """A job actor that dies without untracking: it stops, or its on_receive raises."""

    def on_receive(self, message: Any) -> Any:
        if message == "crash":
            raise RuntimeError("the job's code failed")
        return None


@pytest.mark.parametrize("isolation", ["thread", "process"])
@pytest.mark.parametrize("death", ["stopped", "crashed"])
def test_a_dead_job_actors_claim_ends_and_its_lock_is_deleted(
    server: Server,
    redis_client: redis.Redis,
    caplog: pytest.LogCaptureFixture,
    isolation: str,
    death: str,
) -> None:
    manager = start_link(
        connection=server.url, keys=KEYS, lock_duration=LOCK_MS, isolation=isolation
    )
    tokens = take_locks(redis_client, KEYS, ["dead", "alive"], LOCK_MS)
    job = Job.start()
    living = Job.start()
    track_job(manager, "dead", tokens["dead"], notify=job)
    track_job(manager, "alive", tokens["alive"], notify=living)
    # When the job actor dies without untracking its job
    with caplog.at_level(logging.WARNING, logger="actors"):
        if death == "stopped":
            job.stop()
        else:
            job.tell("crash")
        wait_for(lambda: not job.is_alive(), SOON_S, "the job actor's death")
        # Then its claim ends at the next tick, and its lock is deleted
        wait_for(lambda: not is_tracked(manager, "dead"), SOON_S, "the claim ended")
        wait_for(lambda: not redis_client.exists(KEYS.lock("dead")), SOON_S, "the lock deleted")

        def warned() -> bool:  # written by the manager's record thread, maybe after the delete
            warnings = [r.getMessage() for r in caplog.records if r.name.startswith("actors")]
            return any("'dead'" in w and "no longer alive" in w for w in warnings)

        wait_for(warned, SOON_S, "a warning that job 'dead''s holder is no longer alive")
    # while the living holder's lock is renewed as before
    assert is_tracked(manager, "alive")
    assert redis_client.get(KEYS.lock("alive")) == tokens["alive"].encode()
    stop(manager)


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_another_live_claim_keeps_the_lock_of_a_dead_holder(
    server: Server, redis_client: redis.Redis, caplog: pytest.LogCaptureFixture, isolation: str
) -> None:
    manager = start_link(
        connection=server.url, keys=KEYS, lock_duration=LOCK_MS, isolation=isolation
    )
    tokens = take_locks(redis_client, KEYS, ["shared"], LOCK_MS)
    job = Job.start()
    # Given the worker's plain claim and a job actor's, on one lock
    track_job(manager, "shared", tokens["shared"])
    track_job(manager, "shared", tokens["shared"], notify=job)
    # When the job actor dies
    with caplog.at_level(logging.WARNING, logger="actors"):
        job.stop()
        # Then its claim ends
        wait_for(
            lambda: any("no longer alive" in r.getMessage() for r in caplog.records),
            SOON_S,
            "the dead claim ended",
        )
    # and the worker's keeps the lock renewed past the TTL it had then
    ended = time.monotonic()
    wait_for(lambda: time.monotonic() - ended > 2 * LOCK_MS / 1000, SOON_S, "two TTLs")
    assert get_active_job_count(manager) == 1
    assert redis_client.get(KEYS.lock("shared")) == tokens["shared"].encode()
    stop(manager)


def test_a_lock_held_by_another_token_is_not_deleted_for_a_dead_holder(
    server: Server, redis_client: redis.Redis
) -> None:
    manager = start_link(connection=server.url, keys=KEYS, lock_duration=LOCK_MS)
    tokens = take_locks(redis_client, KEYS, ["moved"], LOCK_MS)
    job = Job.start()
    track_job(manager, "moved", tokens["moved"], notify=job)
    # Given the lock taken by another worker meanwhile
    redis_client.set(KEYS.lock("moved"), "another-worker", px=10 * LOCK_MS)
    job.stop()
    wait_for(lambda: not is_tracked(manager, "moved"), SOON_S, "the claim ended")
    # Then the other worker's lock is left alone
    assert redis_client.get(KEYS.lock("moved")) == b"another-worker"
    stop(manager)
