"""The lease examples run against a real server and end as they say."""

from __future__ import annotations

import asyncio
import re

import redis

from examples import lease_actor, lease_asyncio, lease_thread
from tests.conftest import Server


def test_the_thread_example_stops_when_its_lock_is_stolen(
    server: Server, redis_client: redis.Redis
) -> None:
    done, reason = lease_thread.run(server.url, steps=30, steal_at=5)
    assert reason == "stolen"
    assert 5 < done < 30


def test_the_thread_example_finishes_and_releases_an_unstolen_lock(
    server: Server, redis_client: redis.Redis
) -> None:
    assert lease_thread.run(server.url, steps=10, steal_at=None) == (10, None)
    assert redis_client.keys("*:lock") == []


def test_the_asyncio_example_cancels_the_work_when_its_lock_is_stolen(
    server: Server, redis_client: redis.Redis
) -> None:
    assert asyncio.run(lease_asyncio.run(server.url)) == ("cancelled: lock stolen", 1)


def test_the_actor_example_is_told_in_its_mailbox(
    server: Server, redis_client: redis.Redis
) -> None:
    [ended] = lease_actor.run(server.url)
    match = re.fullmatch(r"lost \(stolen\) after (\d+) steps", ended)
    assert match is not None, ended
    assert 5 < int(match.group(1)) < 30
