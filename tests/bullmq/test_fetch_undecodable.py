"""Process mode: a fetch whose answer the worker cannot decode leaves its lock to expire.

The child takes the job and renews its lock before it answers. When the
worker cannot use the answer (here the job's data is not UTF-8 and the
worker's client decodes replies), it lets the take go: the child stops
renewing, and the lock expires for the stalled check, as in thread mode.
"""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import msgpack
import pytest
import redis.asyncio

from actors import QueueKeys, start_link, stop
from actors.bullmq.hooks import Fetcher

if TYPE_CHECKING:
    import redis as sync_redis

    from tests.support import Server

KEYS = QueueKeys("r2-fetch", prefix="bull")
TTL = 1000
#: Takes ``KEYS[1]`` with the packed options' token, answers as moveToActive does:
#: the job's data first (here one byte that is not UTF-8), its id second.
FETCH = (
    "local token = cmsgpack.unpack(ARGV[3])['token'] "
    "redis.call('SET', KEYS[1], token, 'PX', ARGV[2]) "
    "return {'\\255', ARGV[4]}"
)


def test_a_fetch_whose_answer_cannot_be_decoded_leaves_its_lock_to_expire(
    server: Server, redis_client: sync_redis.Redis
) -> None:
    manager = start_link(connection=server.url, keys=KEYS, lock_duration=TTL, isolation="process")
    told: list[Any] = []
    owner = SimpleNamespace(
        lock_duration=TTL,
        closing=False,
        fetcher=None,
        keys=KEYS,
        connection=None,
        taker=manager.taker,
        taken=lambda *args: told.append(args),
        abandoned=lambda *args: told.append(args),
    )
    conn = redis.asyncio.Redis.from_url(server.url, decode_responses=True)
    fetcher = Fetcher(owner, SimpleNamespace(script=FETCH), conn)
    try:
        args = [KEYS.key_prefix, TTL, msgpack.packb({"token": "tok-1"}), "j"]

        async def fetch() -> object:
            return await fetcher.run([KEYS.lock("j")], args)

        with pytest.raises(UnicodeDecodeError):
            asyncio.run(fetch())
        assert told == []  # the worker never holds the job
        assert redis_client.get(KEYS.lock("j")) == b"tok-1"
        # Then, as in thread mode, nobody renews the lock: it expires within its TTL
        until = time.monotonic() + 3 * TTL / 1000
        while redis_client.get(KEYS.lock("j")) is not None:
            assert time.monotonic() < until, "the child still renews a job nobody holds"
            time.sleep(0.05)
    finally:
        fetcher.close()
        stop(manager)
