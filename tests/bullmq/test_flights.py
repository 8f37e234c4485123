"""The fetches the loop sends itself: found by their tokens when the loop cannot read them.

``find_taken`` runs ``findTaken-1.lua`` on a real server; ``taken_at`` is the
arithmetic that dates a lock found late by its TTL. Then the worker's side:
a token two fetches share, and a fetch connection the server closed while idle.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

import pytest
from bullmq import Worker

from actors.bullmq import use_actor_lock_manager
from actors.bullmq.hooks import taken_at
from actors.keys import QueueKeys
from actors.scripts import find_taken
from tests.bullmq.harness import PREFIX, LoopThread, wait_until
from tests.bullmq.slowlink import slow_link
from tests.bullmq.test_fetch_lanes import cut_fetch_connections, renewal_client

if TYPE_CHECKING:
    import redis

    from tests.bullmq.harness import Bench

KEYS = QueueKeys("flights", prefix="bull")
LOCK_MS = 30_000


def take(client: redis.Redis, job_id: str, token: str, ttl_ms: int = LOCK_MS) -> None:
    """What bullmq's fetch leaves: the id at the head of the active list, its lock set."""
    client.lpush(KEYS.base + ":active", job_id)
    client.set(KEYS.lock(job_id), token, px=ttl_ms)


def test_each_token_names_the_active_job_whose_lock_holds_it(redis_client: redis.Redis) -> None:
    # Given active jobs, one of them with a non-ASCII id, and a lock held by nobody asked
    take(redis_client, "1", "w:1")
    take(redis_client, "né-2", "w:2", ttl_ms=5_000)
    take(redis_client, "3", "other worker")
    # When the tokens of three fetches are looked for, one of which took nothing
    found = find_taken(redis_client, KEYS, ["w:2", "w:9", "w:1"])
    # Then each found job comes with its lock's TTL, in the tokens' order
    assert [None if f is None else f[0] for f in found] == ["né-2", None, "1"]
    assert found[0] is not None and 4_000 < found[0][1] <= 5_000
    assert found[2] is not None and LOCK_MS - 1_000 < found[2][1] <= LOCK_MS


def test_odd_tokens_and_ids_are_found_or_not_never_fail(redis_client: redis.Redis) -> None:
    odd = ["", "x" * 10_000, "\u2603 snow", "w:1"]
    take(redis_client, "1", "w:1")
    redis_client.lpush(KEYS.base + ":active", b"\xff\xfe")  # an id that is not UTF-8
    redis_client.set(KEYS.lock("\ufffd"), "unused")
    redis_client.set(KEYS.base.encode() + b":\xff\xfe:lock", "\u2603 snow")
    found = find_taken(redis_client, KEYS, odd)
    # The job whose id is not UTF-8 is not found (the stalled check hands it on)
    assert found[:3] == [None, None, None]
    assert found[3] is not None and found[3][0] == "1"
    # The same token twice: found once (a token takes one job)
    assert [f is not None for f in find_taken(redis_client, KEYS, ["w:1", "w:1"])] == [True, False]
    assert find_taken(redis_client, KEYS, []) == []


def test_a_flushed_script_is_sent_again(redis_client: redis.Redis) -> None:
    take(redis_client, "1", "w:1")
    redis_client.script_flush()
    found = find_taken(redis_client, KEYS, ["w:1"])
    assert found[0] is not None and found[0][0] == "1"


@pytest.mark.parametrize(
    ("sent", "asked", "pttl", "expected"),
    [
        # The TTL says the lock was taken 200 ms after the send: trusted from then.
        ((1_000, 5_000), (1_500, 5_500), 29_700, (1_200, 5_200)),
        # A TTL that says "earlier than the send" is the clock's slack: the send holds.
        ((1_000, 5_000), (1_100, 5_100), 29_800, (1_000, 5_000)),
        # A lock gone (-2) or without expiry (-1): the send holds.
        ((1_000, 5_000), (9_000, 13_000), -2, (1_000, 5_000)),
        ((1_000, 5_000), (9_000, 13_000), -1, (1_000, 5_000)),
    ],
)
def test_a_lock_found_late_is_trusted_from_its_taking_never_later(
    sent: tuple[int, int], asked: tuple[int, int], pttl: int, expected: tuple[int, int]
) -> None:
    assert taken_at(sent, asked, pttl, LOCK_MS) == expected


#: The workers' lock duration below, in milliseconds.
WORKER_LOCK_MS = 1000
#: How late the slow link hands each reply on, and how long the loop is held, in
#: ms and s: the reply comes while the loop is held, after a look for its job.
REPLY_DELAY_MS = 200
HOLD_S = 0.6


def test_a_job_processed_by_hand_keeps_its_lock_beside_a_fetch_with_its_token(
    one_bench: Bench,
) -> None:
    # Given a job fetched by hand with a token of the caller's (bullmq's manual
    # processing), still being processed, by a worker whose replies come late,
    bench = one_bench
    bench.control()
    loop = LoopThread("by-hand")
    told: list[Any] = []
    token = "my-token"
    with slow_link(bench.url, REPLY_DELAY_MS) as (url, _):

        async def start() -> Any:
            options = {"connection": url, "prefix": PREFIX, "autorun": False}
            worker = Worker(bench.queue, None, {**options, "lockDuration": WORKER_LOCK_MS})
            # Renewals straight to the server: only the worker's replies are late.
            use_actor_lock_manager(worker, connection=bench.url)
            for event in ("lockRenewalFailed", "error"):
                worker.on(event, lambda *args, event=event: told.append((event, args)))
            worker.lockManager.start()
            return worker

        worker = loop.call(start)
        try:
            job_id = bench.add_job({})
            lock = bench.key(job_id, "lock")

            async def fetch() -> Any:
                return await worker.getNextJob(token)

            assert str(loop.call(fetch).id) == job_id

            # When a second fetch with the same token finds the queue empty, and
            # the loop is held while its answer is on its way (a processor
            # calling time.sleep),
            async def fetch_then_hold() -> Any:
                second = asyncio.ensure_future(worker.getNextJob(token))
                for _ in range(10):
                    await asyncio.sleep(0)
                time.sleep(HOLD_S)
                return await second

            assert loop.call(fetch_then_hold) is None

            # Then the first job's lock goes on being renewed: three lock durations.
            until = time.monotonic() + 3 * WORKER_LOCK_MS / 1000
            while time.monotonic() < until:
                assert bench.client.get(lock) == token, "the job's lock was let go"
                time.sleep(0.02)
            assert told == []
        finally:

            async def close() -> None:
                await asyncio.wait_for(worker.close(force=True), 10)

            try:
                loop.call(close)
            finally:
                loop.close()


def test_a_fetch_connection_the_server_closed_while_idle_is_not_used_again(
    one_bench: Bench,
) -> None:
    # Given a worker that has fetched, whose idle fetch connection the server
    # then closes (its idle timeout, CLIENT KILL, a proxy's cut),
    bench = one_bench
    done: list[str] = []

    async def process(job: Any, token: str) -> str:
        done.append(str(job.id))
        return "done"

    first = bench.add_job({})
    worker = bench.start_worker(
        "A",
        process,
        # No idle fetch for 30 s: a fetch in flight is not what is cut here.
        {"lockDuration": WORKER_LOCK_MS, "concurrency": 1, "drainDelay": 30},
        actor=True,
        connection_for_renewal=renewal_client(bench),
    )
    wait_until(lambda: first in done, 10, "the first job to run")
    # Idle: bullmq waits for jobs (BZPOPMIN), no fetch is in flight.
    wait_until(
        lambda: any(c.get("cmd") == "bzpopmin" for c in bench.client.client_list()),
        10,
        "the worker to wait for jobs",
    )
    assert cut_fetch_connections(bench.client) > 0, "no idle fetch connection to cut"

    # When a job is added, the next fetch takes it at once, on a new connection:
    # no fetch fails, and the worker does not wait bullmq's runRetryDelay (15 s).
    second = bench.add_job({})
    wait_until(lambda: second in done, 5, "the second job to run")
    assert worker.events.of("error") == []
