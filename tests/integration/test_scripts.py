"""extendLocks-1.lua and actors.scripts against a real server, on every engine."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

import msgpack
import pytest
import redis
from redis.cache import CacheConfig
from redis.connection import CacheProxyConnection
from redis.driver_info import DriverInfo
from redis.exceptions import ResponseError
from redis.maint_notifications import MaintNotificationsConfig

from actors import QueueKeys, extend_locks
from actors.messages import EXPIRED, STOLEN
from actors.scripts import renew_batch, script_sha, script_source

if TYPE_CHECKING:
    from tests.conftest import Server

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


@pytest.mark.parametrize("max_batch", [None, 1, 2])
def test_an_id_named_twice_is_reported_for_the_entry_whose_token_lost(
    engine_client: redis.Redis, max_batch: int | None
) -> None:
    # As BullMQ's script does: each entry is its own renewal, so the entry
    # with the token the lock no longer holds is the one reported, and the
    # read-back matches that report to that entry, not to the id's last one.
    first, second, third = token(), token(), token()
    lock(engine_client, "0", second)
    lock(engine_client, "1", third)

    failed = extend_locks(
        engine_client, KEYS, ["0", "0", "1"], [first, second, third], 1000, max_batch=max_batch
    )
    outcome = renew_batch(
        engine_client, KEYS, ["0", "1", "0"], [first, third, second], 1000, max_batch=max_batch or 3
    )

    assert failed == ["0"]
    assert (outcome.failed, outcome.errors, outcome.reasons) == (["0"], [], {"0": STOLEN})
    assert engine_client.get(KEYS.lock("0")) == second.encode()


def test_an_id_named_twice_with_its_lock_gone_is_reported_twice(
    engine_client: redis.Redis,
) -> None:
    outcome = renew_batch(engine_client, KEYS, ["0", "0"], [token(), token()], 1000)

    assert (outcome.failed, outcome.errors, outcome.reasons) == (["0", "0"], [], {"0": EXPIRED})


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


def run_script(client: redis.Redis, tokens: object, ids: object, *ttl: str | int) -> Any:
    """EVAL the script with packed arrays; ``ttl`` may be missing or any string."""
    packed_tokens, packed_ids = msgpack.packb(tokens), msgpack.packb(ids)
    return client.eval(
        script_source(), 1, KEYS.stalled, KEYS.key_prefix, packed_tokens, packed_ids, *ttl
    )


KeyStates = dict[Any, tuple[Any, Any]]


def key_states(client: redis.Redis) -> KeyStates:
    """Every key's serialized value and PTTL."""
    return {key: (client.dump(key), client.pttl(key)) for key in client.scan_iter()}


def assert_unchanged(before: KeyStates, after: KeyStates) -> None:
    assert after.keys() == before.keys()
    for key, (value, pttl) in after.items():
        assert value == before[key][0], key
        # Only time may have passed: a TTL never grows, a persistent key stays so.
        assert before[key][1] - 1000 <= pttl <= before[key][1] or pttl == before[key][1] == -1, key


@pytest.mark.parametrize(
    "ttl", ["0", "-1", "-30000", "1.5", "1e3", "+5", "05", " 5", "5 ", "", "abc", "0x10"]
)
def test_a_ttl_that_is_not_a_positive_integer_is_refused_before_any_key_is_read(
    engine_client: redis.Redis, ttl: str
) -> None:
    # PEXPIRE with 0 or less deletes the lock and answers 1: such a call used
    # to destroy held locks, report them renewed and take them out of the
    # stalled set.
    held = token()
    lock(engine_client, "held", held, ttl_ms=5000)
    engine_client.set(KEYS.lock("forever"), held)
    engine_client.sadd(KEYS.stalled, "held", "forever", "other")
    before = key_states(engine_client)
    engine_client.config_resetstat()

    for ids in (["held", "forever", "gone"], ["gone"]):  # held locks or none
        with pytest.raises(ResponseError, match=r"ARGV\[4\] must be the lock TTL"):
            run_script(engine_client, [held, held, held][: len(ids)], ids, ttl)

    called = set(engine_client.info("commandstats")) - {"cmdstat_eval", "cmdstat_config|resetstat"}
    assert called <= {"cmdstat_config"}, called  # Redis 6.2 counts CONFIG as a whole
    assert_unchanged(before, key_states(engine_client))


def test_a_missing_ttl_is_refused(engine_client: redis.Redis) -> None:
    held = token()
    lock(engine_client, "j1", held, ttl_ms=5000)

    with pytest.raises(ResponseError, match=r"ARGV\[4\] must be the lock TTL.*got 'nothing'"):
        run_script(engine_client, [held], ["j1"])

    assert engine_client.get(KEYS.lock("j1")) == held.encode()


def test_the_refusal_shows_the_ttl_it_got(engine_client: redis.Redis) -> None:
    with pytest.raises(ResponseError, match=r"got '-250'"):
        run_script(engine_client, [token()], ["j1"], -250)


def write_other_type(client: redis.Redis, key: str, kind: str) -> None:
    if kind == "hash":
        client.hset(key, "token", "x")
    elif kind == "list":
        client.rpush(key, "x")
    elif kind == "set":
        client.sadd(key, "x")
    elif kind == "zset":
        client.zadd(key, {"x": 1})
    else:
        client.xadd(key, {"token": "x"})
    client.pexpire(key, 5000)


@pytest.mark.parametrize("position", [0, 2, 4])
@pytest.mark.parametrize("kind", ["hash", "list", "set", "zset", "stream"])
def test_a_lock_key_of_another_type_is_lost_and_the_rest_of_the_call_renewed(
    engine_client: redis.Redis, kind: str, position: int
) -> None:
    # GET on such a key raised WRONGTYPE and ended the call: the jobs before
    # it were renewed but never reported, the jobs after it left to expire.
    ids = [f"j{i}" for i in range(5)]
    tokens = [token() for _ in ids]
    for job_id, held in zip(ids, tokens, strict=True):
        lock(engine_client, job_id, held)
    odd = ids[position]
    engine_client.delete(KEYS.lock(odd))
    write_other_type(engine_client, KEYS.lock(odd), kind)
    engine_client.sadd(KEYS.stalled, *ids, "other")
    odd_before = (engine_client.dump(KEYS.lock(odd)), engine_client.pttl(KEYS.lock(odd)))

    assert run_script(engine_client, tokens, ids, 30000) == [odd.encode()]

    for job_id in ids:
        if job_id != odd:
            assert engine_client.pttl(KEYS.lock(job_id)) > 29000, job_id
    assert engine_client.smembers(KEYS.stalled) == {odd.encode(), b"other"}
    assert engine_client.type(KEYS.lock(odd)) == kind.encode()
    assert engine_client.dump(KEYS.lock(odd)) == odd_before[0]
    assert engine_client.pttl(KEYS.lock(odd)) <= odd_before[1]


def test_a_lock_key_of_another_type_is_reported_stolen_by_extend_locks(
    engine_client: redis.Redis,
) -> None:
    tokens = {"a": token(), "b": token(), "c": token()}
    for job_id, held in tokens.items():
        lock(engine_client, job_id, held)
    engine_client.delete(KEYS.lock("b"))
    engine_client.hset(KEYS.lock("b"), "token", tokens["b"])

    assert extend_locks(engine_client, KEYS, list(tokens), list(tokens.values()), 30000) == ["b"]
    outcome = renew_batch(engine_client, KEYS, list(tokens), list(tokens.values()), 30000)

    assert outcome.errors == []
    assert outcome.failed == ["b"]
    assert outcome.reasons == {"b": STOLEN}
    assert engine_client.pttl(KEYS.lock("c")) > 29000


def test_a_get_that_fails_for_another_reason_than_the_type_ends_the_call(
    engine_client: redis.Redis,
) -> None:
    # Only a key of another type explains a failed GET and makes a lost
    # lock: a lock the script was not allowed to read may still be held.
    held = token()
    lock(engine_client, "held", held, ttl_ms=5000)
    user = f"no-get-{uuid.uuid4().hex}"
    engine_client.acl_setuser(
        user, enabled=True, nopass=True, keys=["*"], commands=["+@all", "-get"]
    )
    address = engine_client.connection_pool.connection_kwargs
    limited = redis.Redis(host=address["host"], port=address["port"], username=user)
    try:
        for job_id in ("held", "gone"):
            with pytest.raises(ResponseError, match=r"(?i)permission|can't run"):
                run_script(limited, [held], [job_id], 30000)
    finally:
        limited.close()
        engine_client.acl_deluser(user)

    assert engine_client.pttl(KEYS.lock("held")) <= 5000


def test_ids_and_tokens_are_matched_by_position(engine_client: redis.Redis) -> None:
    # As in BullMQ's script: an id without a token is reported (and its lock
    # left alone), a token without an id is ignored.
    tokens = {"a": token(), "b": token(), "c": token()}
    for job_id, held in tokens.items():
        lock(engine_client, job_id, held)
    ids, values = list(tokens), list(tokens.values())

    assert run_script(engine_client, values[:1], ids, 30000) == [b"b", b"c"]
    assert engine_client.pttl(KEYS.lock("a")) > 29000
    assert engine_client.pttl(KEYS.lock("b")) <= 1000
    assert run_script(engine_client, [*values, token()], ids, 30000) == []
    assert engine_client.pttl(KEYS.lock("c")) > 29000


def test_number_ids_name_the_same_lock_and_number_tokens_never_match(
    engine_client: redis.Redis,
) -> None:
    held = token()
    lock(engine_client, "7", held)
    lock(engine_client, "8", "8")

    assert run_script(engine_client, [held, 8], [7, 8], 30000) == [8]

    assert engine_client.pttl(KEYS.lock("7")) > 29000
    assert engine_client.pttl(KEYS.lock("8")) <= 1000


@pytest.mark.parametrize("odd_id", [True, ["j1"], {"id": "j1"}])
def test_an_id_that_cannot_name_a_key_ends_the_call(
    engine_client: redis.Redis, odd_id: object
) -> None:
    held = token()
    lock(engine_client, "j1", held)

    with pytest.raises(ResponseError):
        run_script(engine_client, [held, held], [odd_id, "j1"], 30000)

    assert engine_client.pttl(KEYS.lock("j1")) <= 1000


@pytest.mark.parametrize("payload", [b"\xc1", b"\x92\xa1x", b""])
def test_malformed_msgpack_ends_the_call_before_any_key_changes(
    engine_client: redis.Redis, payload: bytes
) -> None:
    held = token()
    lock(engine_client, "j1", held, ttl_ms=5000)
    before = key_states(engine_client)
    packed_ids, packed_tokens = msgpack.packb(["j1"]), msgpack.packb([held])

    for tokens_arg, ids_arg in ((payload, packed_ids), (packed_tokens, payload)):
        with pytest.raises(ResponseError):
            engine_client.eval(
                script_source(), 1, KEYS.stalled, KEYS.key_prefix, tokens_arg, ids_arg, 30000
            )

    assert_unchanged(before, key_states(engine_client))


def test_a_user_refused_script_load_but_allowed_eval_renews_after_a_flush(
    engine_client: redis.Redis,
) -> None:
    # An ACL that allows EVALSHA and EVAL but not SCRIPT (as BullMQ's own
    # clients need) once failed every renewal after the script cache emptied.
    user = f"noscript-{uuid.uuid4().hex[:8]}"
    engine_client.acl_setuser(
        user, enabled=True, passwords=["+pw"], keys=["*"], commands=["+@all", "-script"]
    )
    kwargs = engine_client.connection_pool.connection_kwargs
    limited = redis.Redis(host=kwargs["host"], port=kwargs["port"], username=user, password="pw")
    try:
        engine_client.set(KEYS.lock("j"), "t", px=1000)
        engine_client.script_flush()
        with pytest.raises(redis.exceptions.NoPermissionError):
            limited.script_load(script_source())
        # The renewal sends the script itself on NOSCRIPT, and the lock is renewed
        assert extend_locks(limited, KEYS, ["j"], ["t"], 30_000) == []
        assert engine_client.pttl(KEYS.lock("j")) > 1000
        assert extend_locks(limited, KEYS, ["j"], ["t"], 30_000) == []
    finally:
        limited.close()
        engine_client.acl_deluser(user)


@pytest.mark.parametrize("caching", [False, True], ids=["plain", "client-side cache"])
def test_a_batch_in_chunks_survives_a_health_check_due_between_them(
    server: Server, monkeypatch: pytest.MonkeyPatch, caching: bool
) -> None:
    # A client-side caching connection health-checks every send: a PING sent
    # between two chunks would read the first chunk's reply. Valkey 8.1 serves
    # RESP3 client tracking; redis-py allows caching only from Redis 7.4 on.
    monkeypatch.setattr(CacheProxyConnection, "DEFAULT_SERVER_NAME", "valkey")
    monkeypatch.setattr(CacheProxyConnection, "MIN_ALLOWED_VERSION", "7.0.0")
    extra: dict[str, Any] = {"cache_config": CacheConfig()} if caching else {}
    # redis-py pipelines its handshake's tail (CLIENT MAINT_NOTIFICATIONS, SETINFO) and a
    # health check due between those commands reads their replies: an empty tail keeps
    # the connect out of what this test looks at.
    client = redis.Redis.from_url(
        server.url,
        protocol=3,
        health_check_interval=0.0001,
        socket_timeout=5,
        maint_notifications_config=MaintNotificationsConfig(enabled=False),
        driver_info=DriverInfo(name=None, lib_version=None),
        **extra,
    )
    try:
        keys = QueueKeys(f"health-{uuid.uuid4().hex[:6]}")
        ids = [f"j{i}" for i in range(6)]
        tokens = [token() for _ in ids]
        for job_id, value in zip(ids, tokens, strict=True):
            client.set(keys.lock(job_id), value, px=1000)

        outcome = renew_batch(client, keys, ids, tokens, 30_000, max_batch=2)

        assert (outcome.failed, outcome.errors) == ([], [])
        assert min(client.pttl(keys.lock(job_id)) for job_id in ids) > 29_000
    finally:
        client.close()
