"""A take whose arguments cannot be sent is refused at the caller; renewals go on.

The words to the child go through one writer thread: a take whose arguments
could not be pickled once ended it, and no later word (a track, an untrack)
reached the child: its locks expired unreported.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import TYPE_CHECKING

from actors import QueueKeys, start_link, stop, track_job
from actors.process.take import Source

if TYPE_CHECKING:
    import redis

    from tests.support import Server

KEYS = QueueKeys("r2-unpicklable")
TTL = 1000
TAKE = "redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]); return {0, ARGV[3]}"


def test_a_take_with_an_unpicklable_argument_costs_no_other_job_its_renewal(
    server: Server, redis_client: redis.Redis
) -> None:
    manager = start_link(connection=server.url, keys=KEYS, lock_duration=TTL, isolation="process")
    try:
        taker = manager.taker()
        assert taker is not None
        # Given a careless take whose argument does not pickle
        with contextlib.suppress(TypeError, ValueError):  # refused at the caller: fine
            taker(Source(TAKE), [KEYS.lock("x")], [threading.Lock(), TTL, "x"], "tx")
        time.sleep(0.2)
        # When a healthy job is tracked afterwards
        redis_client.set(KEYS.lock("j"), "t", px=TTL)
        track_job(manager, "j", "t")
        # Then its lock is renewed throughout three lock durations
        until = time.monotonic() + 3 * TTL / 1000
        while time.monotonic() < until:
            assert redis_client.get(KEYS.lock("j")) == b"t", "the healthy job's lock expired"
            time.sleep(0.02)
    finally:
        stop(manager)
