"""examples/bullmq_worker.py runs and does what it says."""

from __future__ import annotations

import asyncio

import redis

from examples import bullmq_worker
from tests.conftest import Server


def test_the_example_completes_its_blocking_job_once(
    server: Server, redis_client: redis.Redis
) -> None:
    outcome = asyncio.run(bullmq_worker.run(server.url, lock_ms=600))

    assert outcome["result"] == "rendered"
    assert outcome["attempts_started"] == 1
    assert outcome["stalled"] == 0
    assert outcome["lost"] == 0
    # Three lock durations of blocking, one renewal per half of one.
    assert outcome["renewals"] >= 5
