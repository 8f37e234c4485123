"""Small tools the integration tests share: polling and lock set-up."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable
from typing import TypeVar

import redis

from actors import QueueKeys

T = TypeVar("T")


def wait_for(
    predicate: Callable[[], T], timeout: float, message: str = "condition", interval: float = 0.01
) -> T:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.1f}s waiting for {message}")
        time.sleep(interval)


def new_token() -> str:
    return str(uuid.uuid4())


def take_locks(
    client: redis.Redis, keys: QueueKeys, job_ids: Iterable[str], ttl_ms: int
) -> dict[str, str]:
    """SET NX PX a fresh token on each job's lock, as a move-to-active does."""
    tokens = {job_id: new_token() for job_id in job_ids}
    pipe = client.pipeline(transaction=False)
    for job_id, token in tokens.items():
        pipe.set(keys.lock(job_id), token, nx=True, px=ttl_ms)
    assert all(pipe.execute()), "a lock was already held"
    return tokens


def alive(client: redis.Redis, keys: QueueKeys, tokens: dict[str, str]) -> set[str]:
    """The ids whose lock still holds our token."""
    pipe = client.pipeline(transaction=False)
    for job_id in tokens:
        pipe.get(keys.lock(job_id))
    values = pipe.execute()
    return {
        job_id
        for job_id, value in zip(tokens, values, strict=True)
        if value is not None and value.decode() == tokens[job_id]
    }


def evalsha_calls(client: redis.Redis) -> int:
    stats = client.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))
