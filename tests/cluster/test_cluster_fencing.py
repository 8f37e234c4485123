"""The lock helpers on a cluster: they work where a job's keys share a slot, else say so."""

from __future__ import annotations

import asyncio

import pytest
import redis
import redis.asyncio

from actors import LockLost, QueueKeys, extend_locks, fence, guarded, release, start_link
from tests.support import new_token

pytestmark = pytest.mark.cluster

KEYS = QueueKeys("{fenced}")


def hold(client: redis.RedisCluster, keys: QueueKeys = KEYS) -> str:
    token = new_token()
    assert client.set(keys.lock("42"), token, nx=True, px=30_000)
    client.hset(keys.key_prefix + "42", "data", "{}")
    return token


def test_every_helper_works_on_a_hash_tagged_queue(cluster_client: redis.RedisCluster) -> None:
    # given a job of a queue whose keys share one slot
    token = hold(cluster_client)
    # then fences count, guarded writes to keys of that slot apply, and release deletes
    first, second = (fence(cluster_client, KEYS, "42", token) for _ in range(2))
    assert 0 < first < second
    with guarded(cluster_client, KEYS, "42", token) as pipe:
        pipe.set("{fenced}:result:42", "done")
        pipe.incr("{fenced}:finished")
    assert cluster_client.get("{fenced}:result:42") == b"done"
    assert release(cluster_client, KEYS, "42", token)
    with pytest.raises(LockLost, match="expired"), guarded(cluster_client, KEYS, "42", token) as p:
        p.set("{fenced}:result:42", "stale")
    assert cluster_client.get("{fenced}:result:42") == b"done"


def test_keys_that_cannot_share_a_slot_are_refused_with_the_fix(
    cluster_client: redis.RedisCluster,
) -> None:
    # given a queue without a hash tag: a job's lock and hash fall in different slots
    keys = QueueKeys("plain")
    token = new_token()
    cluster_client.set(keys.lock("42"), token, px=30_000)
    # then a fence is refused before anything is sent, naming the fix
    with pytest.raises(ValueError, match=r"QueueKeys\('\{plain\}'\)"):
        fence(cluster_client, keys, "42", token)
    # and a guarded block writing outside its lock's slot writes nothing
    held = hold(cluster_client)
    with (
        pytest.raises(ValueError, match="lock's hash slot"),
        guarded(cluster_client, KEYS, "42", held) as pipe,
    ):
        pipe.set("{fenced}:result:42", "in the slot")
        pipe.set("elsewhere", "out of it")
    assert not cluster_client.exists("{fenced}:result:42")
    assert not cluster_client.exists("elsewhere")


def test_a_redis_asyncio_cluster_client(cluster_client: redis.RedisCluster) -> None:
    token = hold(cluster_client)
    node = cluster_client.get_default_node()  # type: ignore[no-untyped-call]
    url = f"redis://{node.host}:{node.port}"

    async def holder() -> tuple[int, bool]:
        client = redis.asyncio.RedisCluster.from_url(url)
        try:
            number = await fence(client, KEYS, "42", token)
            async with guarded(client, KEYS, "42", token) as pipe:
                pipe.set("{fenced}:result:42", "done")
            return number, await release(client, KEYS, "42", token)
        finally:
            await client.aclose()

    number, released = asyncio.run(holder())
    assert number > 0
    assert released
    assert cluster_client.get("{fenced}:result:42") == b"done"


@pytest.mark.parametrize("command", [b"DISCARD", "DISCARD ", "exec", memoryview(b"RESET"), "EVAL"])
def test_a_cluster_block_refuses_what_would_undo_its_guard(
    cluster_client: redis.RedisCluster, command: object
) -> None:
    token = hold(cluster_client)
    with (
        pytest.raises(TypeError, match="guarded block"),
        guarded(cluster_client, KEYS, "42", token) as pipe,
    ):
        pipe.set("{fenced}:before", 1)
        pipe.execute_command(command)
    assert not cluster_client.exists("{fenced}:before")
    # and what a block writes is read back through its as-target
    with guarded(cluster_client, KEYS, "42", token) as pipe:
        pipe.incr("{fenced}:finished")
    assert pipe.results == [1]


def test_a_job_id_added_again_on_a_cluster_fences_above_its_old_job(
    cluster_client: redis.RedisCluster,
) -> None:
    # given a job fenced, then removed with its lock and added again with the same id
    first = hold(cluster_client)
    old = fence(cluster_client, KEYS, "42", first)
    cluster_client.delete(KEYS.lock("42"))
    cluster_client.delete(KEYS.key_prefix + "42")
    second = hold(cluster_client)
    # then the new holder's number is larger, and the old holder gets none
    assert fence(cluster_client, KEYS, "42", second) > old
    with pytest.raises(LockLost, match="stolen"):
        fence(cluster_client, KEYS, "42", first)


def test_a_redis_asyncio_cluster_block_refuses_bytes_discard(
    cluster_client: redis.RedisCluster,
) -> None:
    token = hold(cluster_client)
    node = cluster_client.get_default_node()  # type: ignore[no-untyped-call]
    url = f"redis://{node.host}:{node.port}"

    async def holder() -> list[object] | None:
        client = redis.asyncio.RedisCluster.from_url(url)
        try:
            with pytest.raises(TypeError, match="guarded block"):
                async with guarded(client, KEYS, "42", token) as pipe:
                    pipe.set("{fenced}:stale", 1)
                    pipe.execute_command(b"DISCARD")
            async with guarded(client, KEYS, "42", token) as pipe:
                pipe.set("{fenced}:result:42", "done")
            return pipe.results
        finally:
            await client.aclose()

    assert asyncio.run(holder()) == [True]
    assert not cluster_client.exists("{fenced}:stale")


def test_replicas_are_refused_on_a_cluster_client_before_anything_is_written(
    cluster_client: redis.RedisCluster,
) -> None:
    # A cluster pipeline sends a write redirected by MOVED again, to the slot's
    # new owner, after the WAIT beside it was answered by the old one: that
    # WAIT would vouch for a write it never saw.
    token = hold(cluster_client)
    for call in (fence, release, guarded):
        with pytest.raises(TypeError, match="Redis Cluster client"):
            call(cluster_client, KEYS, "42", token, replicas=1)
    with pytest.raises(TypeError, match="Redis Cluster client"):
        extend_locks(cluster_client, KEYS, ["42"], [token], 30_000, replicas=1)
    with pytest.raises(TypeError, match="Redis Cluster client"):
        start_link(connection=cluster_client, keys=KEYS, replicas=1)
    assert cluster_client.get(KEYS.lock("42")) == token.encode()
