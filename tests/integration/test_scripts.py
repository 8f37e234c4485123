"""extendLocks-1.lua and actors.scripts against a real server, on every engine."""

from __future__ import annotations

import uuid

import msgpack
import pytest
import redis
from redis.exceptions import ResponseError

from actors import QueueKeys, extend_locks
from actors.scripts import renew_batch, script_sha, script_source

pytestmark = pytest.mark.both_engines

KEYS = QueueKeys("q")


def token() -> str:
    return str(uuid.uuid4())


def lock(client: redis.Redis, job_id: str, value: str, ttl_ms: int = 1000) -> None:
    client.set(KEYS.lock(job_id), value, px=ttl_ms)


def test_matching_token_resets_ttl_and_leaves_stalled_set(engine_client: redis.Redis) -> None:
    held = token()
    lock(engine_client, "j1", held, ttl_ms=500)
    engine_client.sadd(KEYS.stalled, "j1", "other")

    failed = extend_locks(engine_client, KEYS, ["j1"], [held], 30000)

    assert failed == []
    assert 29000 < engine_client.pttl("emq:q:j1:lock") <= 30000
    assert engine_client.get("emq:q:j1:lock") == held.encode()
    assert engine_client.smembers("emq:q:stalled") == {b"other"}


def test_mismatched_token_is_reported_and_lock_untouched(engine_client: redis.Redis) -> None:
    lock(engine_client, "j1", "someone-else", ttl_ms=5000)
    engine_client.sadd(KEYS.stalled, "j1")

    failed = extend_locks(engine_client, KEYS, ["j1"], [token()], 30000)

    assert failed == ["j1"]
    assert engine_client.get(KEYS.lock("j1")) == b"someone-else"
    assert engine_client.pttl(KEYS.lock("j1")) <= 5000
    assert engine_client.sismember(KEYS.stalled, "j1")


def test_missing_lock_is_reported_and_not_created(engine_client: redis.Redis) -> None:
    failed = extend_locks(engine_client, KEYS, ["gone"], [token()], 30000)

    assert failed == ["gone"]
    assert not engine_client.exists(KEYS.lock("gone"))


def test_mixed_batch_reports_only_lost_ids_in_order(engine_client: redis.Redis) -> None:
    tokens = {f"j{i}": token() for i in range(10)}
    for job_id, held in tokens.items():
        lock(engine_client, job_id, held)
    engine_client.set(KEYS.lock("j3"), "stolen")
    engine_client.delete(KEYS.lock("j7"))
    ids = list(tokens)

    failed = extend_locks(engine_client, KEYS, ids, [tokens[i] for i in ids], 20000)

    assert failed == ["j3", "j7"]
    for job_id in set(ids) - {"j3", "j7"}:
        assert engine_client.pttl(KEYS.lock(job_id)) > 19000


@pytest.mark.parametrize("job_id", ["ünïcødé-✓", "a:b:c", "with space", "42", "{tag}x", "日本"])
def test_odd_ids_are_renewed_and_returned_as_str(engine_client: redis.Redis, job_id: str) -> None:
    held = token()
    lock(engine_client, job_id, held)
    engine_client.sadd(KEYS.stalled, job_id)

    assert extend_locks(engine_client, KEYS, [job_id], [held], 30000) == []
    assert engine_client.pttl(KEYS.lock(job_id)) > 29000
    assert not engine_client.sismember(KEYS.stalled, job_id)
    engine_client.delete(KEYS.lock(job_id))
    assert extend_locks(engine_client, KEYS, [job_id], [held], 30000) == [job_id]


def test_ids_are_str_with_decode_responses(
    engine_server: object, engine_client: redis.Redis
) -> None:
    url = engine_client.connection_pool.connection_kwargs
    decoded = redis.Redis(host=url["host"], port=url["port"], decode_responses=True)
    try:
        assert extend_locks(decoded, KEYS, ["x", "ü"], [token(), token()], 1000) == ["x", "ü"]
    finally:
        decoded.close()


def test_key_prefix_keeps_its_colon(engine_client: redis.Redis) -> None:
    # A prefix without the colon would renew "emq:qj1:lock" and lose the lock.
    held = token()
    engine_client.set("emq:qj1:lock", held)
    lock(engine_client, "j1", held)
    assert extend_locks(engine_client, KEYS, ["j1"], [held], 30000) == []
    assert engine_client.pttl("emq:qj1:lock") == -1


def test_script_is_loaded_after_script_flush(engine_client: redis.Redis) -> None:
    held = token()
    lock(engine_client, "j1", held)
    engine_client.script_flush()
    assert engine_client.script_exists(script_sha()) == [False]

    assert extend_locks(engine_client, KEYS, ["j1"], [held], 30000) == []

    assert engine_client.script_exists(script_sha()) == [True]
    assert engine_client.pttl(KEYS.lock("j1")) > 29000


def test_exactly_one_evalsha_per_call(engine_client: redis.Redis) -> None:
    ids = [f"j{i}" for i in range(300)]
    tokens = [token() for _ in ids]
    for job_id, held in zip(ids, tokens, strict=True):
        lock(engine_client, job_id, held)
    extend_locks(engine_client, KEYS, ids, tokens, 30000)  # loads the script
    engine_client.config_resetstat()

    extend_locks(engine_client, KEYS, ids, tokens, 30000)

    stats = engine_client.info("commandstats")
    assert stats["cmdstat_evalsha"]["calls"] == 1
    assert "cmdstat_script|load" not in stats and "cmdstat_script" not in stats


def test_chunks_share_one_round_trip_and_merge_results(engine_client: redis.Redis) -> None:
    ids = [f"j{i}" for i in range(2500)]
    tokens = [token() for _ in ids]
    pipe = engine_client.pipeline(transaction=False)
    for job_id, held in zip(ids, tokens, strict=True):
        pipe.set(KEYS.lock(job_id), held, px=2000)
    pipe.execute()
    lost = {"j5", "j1500", "j2499"}
    engine_client.delete(*(KEYS.lock(i) for i in lost))
    engine_client.script_flush()

    outcome = renew_batch(engine_client, KEYS, ids, tokens, 30000, max_batch=1000)

    assert outcome.errors == []
    assert outcome.failed == ["j5", "j1500", "j2499"]
    assert engine_client.pttl(KEYS.lock("j2498")) > 29000
    engine_client.config_resetstat()
    renew_batch(engine_client, KEYS, ids, tokens, 30000, max_batch=1000)
    assert engine_client.info("commandstats")["cmdstat_evalsha"]["calls"] == 3


def test_bad_input_fails_before_anything_is_sent(engine_client: redis.Redis) -> None:
    engine_client.config_resetstat()
    with pytest.raises(ValueError, match="same length"):
        extend_locks(engine_client, KEYS, ["a", "b"], [token()], 1000)
    with pytest.raises(ValueError, match="job_ids"):
        extend_locks(engine_client, KEYS, [""], [token()], 1000)
    with pytest.raises(ValueError, match="tokens"):
        extend_locks(engine_client, KEYS, ["a"], [""], 1000)
    with pytest.raises(ValueError, match="duration"):
        extend_locks(engine_client, KEYS, ["a"], [token()], 0)
    assert extend_locks(engine_client, KEYS, [], [], 1000) == []
    assert "cmdstat_evalsha" not in engine_client.info("commandstats")


def test_non_list_reply_is_an_error(engine_client: redis.Redis) -> None:
    # A server-side script with the same SHA cannot differ, so the check is
    # exercised through a chunk that errors on the server instead.
    with pytest.raises(ResponseError):
        engine_client.eval(script_source(), 1, KEYS.stalled, KEYS.key_prefix, b"\xc1", b"\xc1", 1)
    packed = msgpack.packb(["a"])
    assert engine_client.eval(
        script_source(), 1, KEYS.stalled, KEYS.key_prefix, packed, packed, 1
    ) == [b"a"]


def test_check_items_false_leaves_checking_to_the_caller(engine_client: redis.Redis) -> None:
    # The manager checks ids and tokens when they are tracked, not each tick.
    with pytest.raises(ValueError, match="job_ids"):
        renew_batch(engine_client, KEYS, [""], [token()], 1000)

    outcome = renew_batch(engine_client, KEYS, [""], [token()], 1000, check_items=False)

    assert outcome.failed == [""]
    with pytest.raises(ValueError, match="same length"):
        renew_batch(engine_client, KEYS, ["a"], [], 1000, check_items=False)


def test_the_ttl_is_re_armed_without_touching_the_value(engine_client: redis.Redis) -> None:
    held = token()
    engine_client.set(KEYS.lock("j"), held)  # no TTL at all

    assert extend_locks(engine_client, KEYS, ["j"], [held], 5000) == []

    assert engine_client.get(KEYS.lock("j")) == held.encode()
    assert 4000 < engine_client.pttl(KEYS.lock("j")) <= 5000
