"""The fetches the loop sends itself: found by their tokens when the loop cannot read them.

``find_taken`` runs ``findTaken-1.lua`` on a real server; ``taken_at`` is the
arithmetic that dates a lock found late by its TTL.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from actors.bullmq.hooks import taken_at
from actors.keys import QueueKeys
from actors.scripts import find_taken

if TYPE_CHECKING:
    import redis

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
