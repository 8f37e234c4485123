"""``replicas=`` beside chunk errors, a flushed script cache, threads sharing a client."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from typing import TYPE_CHECKING

import pytest
import redis
import redis.asyncio

import actors
from actors import NotReplicatedError, QueueKeys, Replicas, lease
from actors.scripts import run_chunks
from tests.support import new_token
from tests.support.replication import ReplicatedPair

if TYPE_CHECKING:
    from collections.abc import Iterator

KEYS = QueueKeys("held")
CONFIRM = Replicas(1, timeout=100)


@pytest.fixture
def primary(pair: ReplicatedPair) -> Iterator[redis.Redis]:
    client = pair.client()
    pair.attach()
    pair.flush()
    try:
        yield client
    finally:
        client.close()


def take(client: redis.Redis, job_id: str, px: int = 60_000) -> str:
    token = new_token()
    assert client.set(KEYS.lock(job_id), token, px=px)
    return token


def test_every_chunk_is_unconfirmed_beside_errored_ones(
    pair: ReplicatedPair, primary: redis.Redis
) -> None:
    ids = ["a", "b", "c"]
    tokens = [take(primary, job_id) for job_id in ids]
    primary.delete(KEYS.lock("b"))  # chunk 1 renews nothing: it runs, and reports b
    primary.set(KEYS.stalled, "not a set")  # chunks 0 and 2 error after their PEXPIRE
    pair.detach()
    outcome = run_chunks(primary, KEYS, ids, tokens, 60_000, 1, CONFIRM)
    kinds = {(e.start, e.stop): type(e.error).__name__ for e in outcome.errors}
    assert kinds == {(0, 1): "ResponseError", (1, 2): "NotReplicatedError", (2, 3): "ResponseError"}
    assert outcome.failed == ["b"]


def test_a_flushed_script_cache_neither_breaks_nor_fakes_confirmation(
    pair: ReplicatedPair, primary: redis.Redis
) -> None:
    ids = ["a", "b", "c"]
    tokens = [take(primary, job_id) for job_id in ids]
    for _ in range(3):
        primary.script_flush()
        assert run_chunks(primary, KEYS, ids, tokens, 60_000, 2, CONFIRM).errors == []
    pair.detach()
    primary.script_flush()
    outcome = run_chunks(primary, KEYS, ids, tokens, 60_000, 2, CONFIRM)
    assert [type(e.error) for e in outcome.errors] == [NotReplicatedError] * 2


def test_a_lease_holds_through_script_flushes_and_is_told_once_cut_off(
    pair: ReplicatedPair, primary: redis.Redis
) -> None:
    token = take(primary, "job", px=1000)
    manager = actors.start_link(
        connection=pair.primary.url, keys=KEYS, lock_duration=1000, replicas=1
    )
    try:
        with lease(manager, "job", token) as held:
            end = time.monotonic() + 2.5
            while time.monotonic() < end:
                primary.script_flush()
                time.sleep(0.1)
            assert not held.lost
            pair.detach()
            assert held.wait(timeout=3)
            assert held.reason == "unconfirmed"
    finally:
        actors.stop(manager)


def test_many_threads_share_one_client_for_confirmed_guarded_writes(
    primary: redis.Redis,
) -> None:
    token = take(primary, "job")
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(15):
                with actors.guarded(primary, KEYS, "job", token, replicas=1) as pipe:
                    pipe.incr("counter")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert primary.get("counter") == b"90"
    assert all(primary.ping() for _ in range(6))


def test_cancelling_a_confirmed_write_leaves_no_stale_reply_in_the_pool(
    pair: ReplicatedPair, primary: redis.Redis
) -> None:
    token = take(primary, "job")
    primary.hset(KEYS.key_prefix + "job", "name", "x")
    primary.set("k", "v")
    pair.detach()

    async def scenario() -> list[object]:
        client = redis.asyncio.Redis.from_url(pair.primary.url, socket_timeout=10)
        stale: list[object] = []
        try:
            for delay in (0, 0.001, 0.005, 0.05, 0.12):
                for call in ("guarded", "fence"):

                    async def run(call: str = call) -> None:
                        if call == "fence":
                            await actors.fence(
                                client, KEYS, "job", token, replicas=Replicas(1, timeout=200)
                            )
                        else:
                            async with actors.guarded(
                                client, KEYS, "job", token, replicas=Replicas(1, timeout=200)
                            ) as pipe:
                                pipe.set("g", "1")

                    task = asyncio.ensure_future(run())
                    await asyncio.sleep(delay)
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, NotReplicatedError):
                        await task
                    stale += [v for v in [await client.get("k") for _ in range(3)] if v != b"v"]
        finally:
            await client.aclose()
        return stale

    assert asyncio.run(scenario()) == []
