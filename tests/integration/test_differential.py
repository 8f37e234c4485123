"""Our extendLocks-1.lua against BullMQ's own, on identical copies of random states.

Hypothesis draws a batch of jobs, each with a lock state (held by the token,
held by another, missing; with or without a TTL) and stalled-set membership,
with or without other members in the stalled set (or no stalled set at all).
The same state is written to two databases of one server; our script runs on
one and the script shipped in the PyPI ``bullmq`` package on the other. The
returned ids and every resulting key must match (TTLs within a tolerance).
"""

from __future__ import annotations

from collections.abc import Iterator
from importlib import resources
from typing import Any

import msgpack
import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from actors import QueueKeys
from actors.scripts import script_source
from tests.conftest import Server

pytestmark = pytest.mark.both_engines

KEYS = QueueKeys("diff")
TTL_TOLERANCE_MS = 250

job_ids = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=12
)
lock_states = st.sampled_from(["ours", "theirs", "missing", "ours-persistent"])
jobs = st.lists(
    st.tuples(job_ids, lock_states, st.booleans(), st.integers(5000, 60000)), max_size=12
)


def bullmq_script() -> str:
    path = resources.files("bullmq") / "commands" / "extendLocks-1.lua"
    return path.read_text(encoding="utf-8")


@pytest.fixture
def databases(engine_server: Server) -> Iterator[tuple[redis.Redis, redis.Redis]]:
    ours = engine_server.client(db=1)
    theirs = engine_server.client(db=2)
    ours.set("probe", 1)
    assert not theirs.exists("probe"), "the two copies must live in separate databases"
    yield ours, theirs
    for client in (ours, theirs):
        client.flushdb()
        client.close()


def write_state(
    client: redis.Redis, batch: list[tuple[str, str, bool, int]], bystander: bool
) -> list[str]:
    client.flushdb()
    tokens = []
    for index, (job_id, state, stalled, ttl) in enumerate(batch):
        token = f"token-{index}-{job_id}"
        tokens.append(token)
        if state == "ours":
            client.set(KEYS.lock(job_id), token, px=ttl)
        elif state == "ours-persistent":
            client.set(KEYS.lock(job_id), token)
        elif state == "theirs":
            client.set(KEYS.lock(job_id), "someone-else", px=ttl)
        if stalled:
            client.sadd(KEYS.stalled, job_id)
    if bystander:
        client.sadd(KEYS.stalled, "bystander")
    return tokens


def snapshot(client: redis.Redis) -> dict[bytes, Any]:
    state: dict[bytes, Any] = {}
    for key in client.scan_iter(count=1000):
        kind = client.type(key)
        if kind == b"string":
            state[key] = (client.get(key), client.pttl(key))
        else:
            state[key] = client.smembers(key)
    return state


def run(client: redis.Redis, source: str, ids: list[str], tokens: list[str], ttl: int) -> Any:
    return client.eval(
        source,
        1,
        KEYS.stalled,
        KEYS.key_prefix,
        msgpack.packb(tokens),
        msgpack.packb(ids),
        ttl,
    )


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(batch=jobs, ttl=st.integers(1000, 120000), bystander=st.booleans())
def test_our_script_behaves_exactly_like_bullmqs(
    databases: tuple[redis.Redis, redis.Redis],
    batch: list[tuple[str, str, bool, int]],
    ttl: int,
    bystander: bool,
) -> None:
    ours, theirs = databases
    ids = [job_id for job_id, *_ in batch]
    tokens = write_state(ours, batch, bystander)
    write_state(theirs, batch, bystander)

    our_reply = run(ours, script_source(), ids, tokens, ttl)
    their_reply = run(theirs, bullmq_script(), ids, tokens, ttl)

    assert our_reply == their_reply
    our_keys, their_keys = snapshot(ours), snapshot(theirs)
    assert our_keys.keys() == their_keys.keys()
    for key, value in our_keys.items():
        other = their_keys[key]
        if isinstance(value, tuple):
            assert value[0] == other[0], key
            assert (value[1] == -1) == (other[1] == -1), key
            assert abs(value[1] - other[1]) <= TTL_TOLERANCE_MS, key
        else:
            assert value == other, key
