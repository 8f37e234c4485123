"""The lock helpers on a real server: release, fence and guarded writes, sync and asyncio.

Each holds a job through a lock as BullMQ takes it (``SET NX PX`` with the
worker's token) beside the job's hash, and checks what a holder and a stale
holder can and cannot do.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from typing import TYPE_CHECKING, Any

import pytest
import redis
import redis.asyncio
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.retry import Retry

import actors
from actors import LockLost, QueueKeys, fence, guarded, release
from actors.fencing import _DATA_COMMANDS, FENCE_FIELD
from tests.faults.proxy import FaultProxy
from tests.support import command_calls, new_token

if TYPE_CHECKING:
    from collections.abc import Iterator

    from tests.conftest import Server

KEYS = QueueKeys("fences")
TTL_MS = 30_000


def hold(client: redis.Redis, job_id: str = "42", *, job: bool = True) -> str:
    """Take ``job_id``'s lock with a fresh token (and create its hash); return the token."""
    token = new_token()
    assert client.set(KEYS.lock(job_id), token, nx=True, px=TTL_MS)
    if job:
        client.hset(KEYS.key_prefix + job_id, mapping={"name": "work", "data": "{}"})
    return token


def take_over(client: redis.Redis, job_id: str = "42") -> str:
    """Let the lock go as a stalled check would and take it with a new token."""
    client.delete(KEYS.lock(job_id))
    return hold(client, job_id, job=False)


@pytest.fixture
def decoding(server: Server, redis_client: redis.Redis) -> Iterator[redis.Redis]:
    """A client of the same (flushed) server that decodes replies to ``str``."""
    client = server.client(decode_responses=True)
    yield client
    client.close()


@pytest.fixture(params=["bytes", "decoded"])
def client(
    request: pytest.FixtureRequest, redis_client: redis.Redis, decoding: redis.Redis
) -> redis.Redis:
    """Each kind of client in turn: raw replies, and ``decode_responses=True``."""
    return redis_client if request.param == "bytes" else decoding


# -- release ------------------------------------------------------------------------


def test_release_deletes_the_holders_lock_and_no_one_elses(client: redis.Redis) -> None:
    # given a lock held by this worker, and one another worker took since
    mine = hold(client, "1")
    stale = hold(client, "2")
    theirs = take_over(client, "2")

    # when both are released with this worker's tokens
    # then only the own lock goes; the other worker's stays as it was
    assert release(client, KEYS, "1", mine) is True
    assert release(client, KEYS, "2", stale) is False
    assert not client.exists(KEYS.lock("1"))
    assert client.get(KEYS.lock("2")) in {theirs, theirs.encode()}
    # and a lock that is gone already is no error
    assert release(client, KEYS, "1", mine) is False


# -- fence --------------------------------------------------------------------------


def test_fences_strictly_increase_across_holders_and_live_in_the_jobs_hash(
    client: redis.Redis,
) -> None:
    # given a job held by one worker, who takes two fences
    first = hold(client)
    taken = [fence(client, KEYS, "42", first), fence(client, KEYS, "42", first)]
    # when the job passes to a second worker and then a third
    second = take_over(client)
    taken.append(fence(client, KEYS, "42", second))
    third = take_over(client)
    taken.append(fence(client, KEYS, "42", third))

    # then every number is larger than any earlier holder's
    assert taken == sorted(set(taken))
    # and it is one field of the job's hash: no key was added, the job's fields are untouched
    assert sorted(k.decode() if isinstance(k, bytes) else k for k in client.keys("*")) == [
        KEYS.key_prefix + "42",
        KEYS.lock("42"),
    ]
    fields = {
        (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
        for k, v in client.hgetall(KEYS.key_prefix + "42").items()
    }
    assert fields == {"name": "work", "data": "{}", FENCE_FIELD: str(taken[-1])}


def test_a_stale_holder_gets_no_fence_and_learns_why(client: redis.Redis) -> None:
    # given a holder whose job another worker took
    stale = hold(client)
    take_over(client)
    # when the stale holder asks for a fence
    with pytest.raises(LockLost) as raised:
        fence(client, KEYS, "42", stale)
    # then it is told the lock was stolen, and no number was spent
    assert (raised.value.job_id, raised.value.token, raised.value.reason) == (
        "42",
        stale,
        "stolen",
    )
    assert client.hget(KEYS.key_prefix + "42", FENCE_FIELD) is None

    # and once the lock is gone the reason says so
    client.delete(KEYS.lock("42"))
    with pytest.raises(LockLost, match="expired"):
        fence(client, KEYS, "42", stale)


def test_a_lock_key_of_another_type_is_another_holders(client: redis.Redis) -> None:
    # given a job whose lock key is a hash, not a token
    token = hold(client)
    client.delete(KEYS.lock("42"))
    client.hset(KEYS.lock("42"), "token", token)
    # then neither a fence nor a guarded write treats it as held
    with pytest.raises(LockLost, match="stolen"):
        fence(client, KEYS, "42", token)
    with pytest.raises(LockLost, match="stolen"), guarded(client, KEYS, "42", token) as pipe:
        pipe.set("result", "stale")
    assert not client.exists("result")


def test_a_fence_needs_the_jobs_hash(client: redis.Redis) -> None:
    # given a bare lock with no job behind it
    token = hold(client, job=False)
    # then no fence is taken, and nothing is created that could pass for a job
    with pytest.raises(LookupError, match="no hash at 'emq:fences:42'"):
        fence(client, KEYS, "42", token)
    assert not client.exists(KEYS.key_prefix + "42")


@pytest.mark.parametrize("job_id", ["é-ß-任务-🚀", "x" * 2000, "with space", "{tag}"])
def test_odd_ids_and_tokens_fence_their_own_job(client: redis.Redis, job_id: str) -> None:
    token = hold(client, job_id)
    assert fence(client, KEYS, job_id, token) > 0
    assert release(client, KEYS, job_id, token)


@pytest.mark.parametrize(
    ("job_id", "token", "error", "match"),
    [
        ("", "t", ValueError, "job_id must not be empty"),
        ("42", "", ValueError, "token must not be empty"),
        ("\udc80", "t", ValueError, "job_id must encode as UTF-8"),
        ("42", "\ud800", ValueError, "token must encode as UTF-8"),
        (42, "t", TypeError, "job_id must be a str"),
        ("42", b"t", TypeError, "token must be a str"),
    ],
)
def test_bad_ids_and_tokens_fail_at_the_call_naming_the_argument(
    redis_client: redis.Redis, job_id: Any, token: Any, error: type[Exception], match: str
) -> None:
    for helper in (release, fence, guarded):
        with pytest.raises(error, match=match):
            helper(redis_client, KEYS, job_id, token)
    assert redis_client.dbsize() == 0


def test_a_client_of_the_wrong_kind_fails_at_the_call(
    redis_client: redis.Redis, server: Server
) -> None:
    token = hold(redis_client)
    latin = server.client(encoding="latin-1")
    cases: list[tuple[Any, type[Exception], str]] = [
        (server.url, TypeError, "client must be a redis.Redis"),
        (redis_client.pipeline(), TypeError, "not a pipeline"),
        (None, TypeError, "got NoneType"),
        (latin, ValueError, "encodes with 'latin-1'"),
    ]
    try:
        for bad, error, match in cases:
            for helper in (release, fence, guarded):
                with pytest.raises(error, match=match):
                    helper(bad, KEYS, "42", token)
        with pytest.raises(TypeError, match="keys must be a QueueKeys"):
            fence(redis_client, "fences", "42", token)  # type: ignore[call-overload]
    finally:
        latin.close()
    # and the lock is still held: nothing was touched
    assert redis_client.get(KEYS.lock("42")) == token.encode()


# -- guarded ------------------------------------------------------------------------


def test_guarded_writes_apply_while_the_lock_holds_the_token(client: redis.Redis) -> None:
    token = hold(client)
    block = guarded(client, KEYS, "42", token)
    with block as pipe:
        pipe.set("result:42", "done")
        pipe.incr("finished")
        pipe.execute_command("HSET", "results", "42", "done")
    assert client.get("result:42") in {"done", b"done"}
    assert block.results == [True, 1, 1]


def test_a_stale_holders_guarded_writes_are_refused_and_nothing_is_written(
    client: redis.Redis,
) -> None:
    # given a holder whose job another worker took while it was writing
    stale = hold(client)
    with pytest.raises(LockLost) as raised, guarded(client, KEYS, "42", stale) as pipe:
        pipe.set("result:42", "stale")
        pipe.incr("finished")
        take_over(client)
    # then none of its writes landed
    assert raised.value.reason == "stolen"
    assert not client.exists("result:42", "finished")
    # and the same once the lock is gone
    client.delete(KEYS.lock("42"))
    with pytest.raises(LockLost, match="expired"), guarded(client, KEYS, "42", stale) as pipe:
        pipe.set("result:42", "stale")
    assert not client.exists("result:42")


def test_a_block_that_raises_writes_nothing(client: redis.Redis) -> None:
    token = hold(client)
    with pytest.raises(RuntimeError, match="half-way"), guarded(client, KEYS, "42", token) as pipe:
        pipe.set("result:42", "half")
        raise RuntimeError("half-way")
    assert not client.exists("result:42")


def test_renewals_during_guarded_writes_never_refuse_the_holder(
    redis_client: redis.Redis, server: Server
) -> None:
    # given the lock renewed every millisecond (SET with the same token), far more
    # often than any manager renews it
    token = hold(redis_client)
    watched = command_calls(redis_client, "watch")
    renewing = threading.Event()
    stop = threading.Event()

    def renew() -> None:
        renewer = server.client()
        while not stop.is_set():
            renewer.set(KEYS.lock("42"), token, px=TTL_MS)
            renewing.set()
            time.sleep(0.001)
        renewer.close()

    thread = threading.Thread(target=renew, daemon=True)
    thread.start()
    try:
        assert renewing.wait(10)
        # when the holder writes many times meanwhile
        for i in range(200):
            with guarded(redis_client, KEYS, "42", token) as pipe:
                pipe.rpush("writes", i)
    finally:
        stop.set()
        thread.join(10)
    # then every write applied, once: a touched lock that still holds the token is tried again
    assert [int(x) for x in redis_client.lrange("writes", 0, -1)] == list(range(200))
    assert command_calls(redis_client, "watch") - watched > 200, "no renewal touched a write"


def test_the_wrong_with_for_the_client_is_refused(
    redis_client: redis.Redis, server: Server
) -> None:
    token = hold(redis_client)
    async_client = redis.asyncio.Redis.from_url(server.url)

    async def enter_sync_client_async() -> None:
        async with guarded(redis_client, KEYS, "42", token):
            pass

    with pytest.raises(TypeError, match="'async with'"), guarded(async_client, KEYS, "42", token):
        pass
    with pytest.raises(TypeError, match="entered with 'with'"):
        asyncio.run(enter_sync_client_async())


def test_a_connection_dropped_after_exec_reached_the_server_applies_the_block_once(
    redis_client: redis.Redis, server: Server
) -> None:
    # Given a holder whose client retries a dropped connection, through a proxy
    # that lets the block's EXEC reach the server and then drops the connection
    token = hold(redis_client)
    with FaultProxy.to(server.url) as proxy:
        client = redis.Redis.from_url(proxy.url, retry=Retry(NoBackoff(), 3))
        assert client.ping()
        proxy.drop_reply_to("EXEC")

        # When the guarded block runs, then the holder sees the drop
        with pytest.raises(redis.ConnectionError), guarded(client, KEYS, "42", token) as pipe:
            pipe.incr("applied:42")
        client.close()

    # And the server ran the block exactly once: it was never sent again
    assert proxy.cuts == 1
    assert redis_client.get("applied:42") == b"1"


def test_an_async_block_whose_exec_reply_is_lost_is_applied_once(
    redis_client: redis.Redis, server: Server
) -> None:
    token = hold(redis_client)

    async def holder(url: str) -> None:
        client = redis.asyncio.Redis.from_url(url, retry=AsyncRetry(NoBackoff(), 3))
        try:
            assert await client.ping()
            proxy.drop_reply_to("EXEC")
            with pytest.raises(redis.ConnectionError):
                async with guarded(client, KEYS, "42", token) as pipe:
                    pipe.incr("applied:42")
        finally:
            await client.aclose()

    with FaultProxy.to(server.url) as proxy:
        asyncio.run(holder(proxy.url))

    assert proxy.cuts == 1
    assert redis_client.get("applied:42") == b"1"


# -- asyncio ------------------------------------------------------------------------


def test_every_helper_on_a_redis_asyncio_client(redis_client: redis.Redis, server: Server) -> None:
    token = hold(redis_client)

    async def holder() -> tuple[list[int], list[Any] | None, bool]:
        client = redis.asyncio.Redis.from_url(server.url, decode_responses=True)
        try:
            fences = [await fence(client, KEYS, "42", token) for _ in range(2)]
            block = guarded(client, KEYS, "42", token)
            async with block as pipe:
                pipe.set("result:42", "done")
            stale = take_over(redis_client)
            with pytest.raises(LockLost, match="stolen"):
                await fence(client, KEYS, "42", token)
            with pytest.raises(LockLost, match="stolen"):
                async with guarded(client, KEYS, "42", token) as pipe:
                    pipe.set("result:42", "stale")
            return fences, block.results, await release(client, KEYS, "42", stale)
        finally:
            await client.aclose()

    fences, results, released = asyncio.run(holder())
    assert 0 < fences[0] < fences[1]
    assert results == [True]
    assert redis_client.get("result:42") == b"done"
    assert released
    assert not redis_client.exists(KEYS.lock("42"))


def test_the_helpers_are_the_packages() -> None:
    assert {"fence", "guarded", "release"} <= set(actors.__all__)


# -- what a hostile caller tried ------------------------------------------------------


def test_a_guarded_block_is_entered_once(redis_client: redis.Redis) -> None:
    token = hold(redis_client)
    block = guarded(redis_client, KEYS, "42", token)
    with block as pipe:
        pipe.incr("x")
    with pytest.raises(RuntimeError, match="entered once"), block:
        pass
    assert redis_client.get("x") == b"1"


#: Names that would end the block's transaction, change its connection, or
#: are no data command, in the spellings a caller might try.
UNDOING = [
    "EXEC", "MULTI", "DISCARD", "WATCH", "UNWATCH", "RESET", "QUIT", "select", "CLIENT",
    "client reply", "HELLO", "AUTH", "MONITOR", "SUBSCRIBE", "SWAPDB", "FLUSHALL", "KEYS",
    "EVAL", "FCALL", "PUBLISH", "CONFIG SET", "SCRIPT",
    "discard", "Discard", "DISCARD ", " DISCARD", "discard\t", "DISCARD\n", "\tMULTI  ",
    "DISCARD\u00a0", "SET\tk", "GET  k", "", "   ", "DISCARD\x00",
    b"DISCARD", b"discard", b"DISCARD ", b" DISCARD", b"DISCARD\t", b"EXEC", b"RESET",
    bytearray(b"DISCARD"), memoryview(b"DISCARD"), memoryview(b"exec"), b"",
    42, None, 4.5, ("DISCARD",),
]  # fmt: skip


def shown(value: object) -> str:
    """A test id that is the same in every process (a memoryview's repr has its address)."""
    if isinstance(value, memoryview):
        return f"memoryview({bytes(value)!r})"
    return repr(value)


@pytest.mark.parametrize("command", UNDOING, ids=shown)
def test_commands_that_would_undo_the_guard_are_refused_at_the_call(
    redis_client: redis.Redis, command: Any
) -> None:
    # given a holder whose block refuses a command
    token = hold(redis_client)
    refused = pytest.raises(TypeError, match=r"guarded block|command name")
    with refused, guarded(redis_client, KEYS, "42", token) as pipe:
        pipe.set("e1", 1)
        pipe.execute_command(command, "x")
        pipe.set("e2", 2)
    # then it raised at the call, and nothing was written
    assert not redis_client.exists("e1", "e2", "x")


@pytest.mark.parametrize("command", [b"DISCARD", "DISCARD ", memoryview(b"RESET")], ids=shown)
def test_a_block_refused_a_command_writes_nothing_though_the_refusal_was_caught(
    redis_client: redis.Redis, command: Any
) -> None:
    # given a holder that swallows the refusal and writes on, while another
    # worker takes the job before the block ends
    stale = hold(redis_client)
    refused = pytest.raises(TypeError, match="nothing was written")
    with refused, guarded(redis_client, KEYS, "42", stale) as pipe:
        with contextlib.suppress(TypeError):
            pipe.execute_command(command)
        pipe.set("after", "stale")
        take_over(redis_client)
    # then nothing was written, and the block said why on exit
    assert not redis_client.exists("after")
    # and a holder that keeps the lock writes nothing either
    token = take_over(redis_client)
    block = guarded(redis_client, KEYS, "42", token)
    with pytest.raises(TypeError, match="nothing was written"), block as pipe:
        with contextlib.suppress(TypeError):
            pipe.execute_command(command)
        pipe.set("after", "kept")
    assert not redis_client.exists("after")
    assert block.results is None


def test_the_block_has_no_door_to_its_transaction(redis_client: redis.Redis) -> None:
    token = hold(redis_client)
    with pytest.raises(TypeError), guarded(redis_client, KEYS, "42", token) as pipe:
        for door in (
            "multi", "execute", "reset", "discard", "immediate_execute_command",
            "pipeline_execute_command", "connection", "connection_pool", "transaction",
            "pipeline", "client", "_client", "send_command",
        ):  # fmt: skip
            assert not hasattr(pipe, door), door
        pipe.set("before", 1)
        with pytest.raises(TypeError, match="WATCH"):
            pipe.watch(KEYS.lock("42"))
        pipe.unwatch()
    assert not redis_client.exists("before")


def test_a_name_in_a_buffer_changed_after_the_call_changes_nothing(
    redis_client: redis.Redis,
) -> None:
    token = hold(redis_client)
    name = bytearray(b"SET")
    with guarded(redis_client, KEYS, "42", token) as pipe:
        pipe.execute_command(name, "k", "v")
        name[:] = b"DISCARD"
        pipe.incr("n")
    assert redis_client.get("k") == b"v"
    assert pipe.results == [b"OK", 1]  # a bytes name gets redis-py's raw reply


class Shifty(str):
    """A name that reads as SET when checked and as DISCARD when redis-py sends it."""

    calls = 0

    def encode(self, *args: Any, **kwargs: Any) -> bytes:
        Shifty.calls += 1
        return b"SET" if Shifty.calls == 1 else b"DISCARD"


def test_a_name_that_answers_differently_later_is_sent_as_checked(
    redis_client: redis.Redis,
) -> None:
    token = hold(redis_client)
    with guarded(redis_client, KEYS, "42", token) as pipe:
        pipe.execute_command(Shifty("SET"), "k", "v")
        pipe.incr("n")
    assert redis_client.get("k") == b"v"
    assert pipe.results == [True, 1]


@pytest.mark.parametrize("name", ["set", "SET", b"SET", b"set", memoryview(b"Set")], ids=shown)
def test_data_commands_in_any_case_str_or_bytes_are_kept(
    redis_client: redis.Redis, name: Any
) -> None:
    token = hold(redis_client)
    with guarded(redis_client, KEYS, "42", token) as pipe:
        pipe.execute_command(name, "k", "v")
        pipe.xadd("stream", {"f": "v"})
        pipe.xinfo_stream("stream")  # "XINFO STREAM": a name of two words
    assert redis_client.get("k") == b"v"
    assert pipe.results is not None
    assert pipe.results[2]["length"] == 1


def test_the_data_commands_are_what_the_server_calls_keyed_data_commands(
    redis_client: redis.Redis,
) -> None:
    # every name a block takes that this server knows reads or writes keys, and
    # is no transaction, connection, script, pub/sub or administration command
    table = redis_client.command()
    outside = {"@admin", "@connection", "@transaction", "@pubsub", "@scripting"}
    known = {name.upper().encode(): info for name, info in table.items()}
    for name in _DATA_COMMANDS & set(known):
        info = known[name]
        categories = {c.decode() if isinstance(c, bytes) else c for c in info["acl_categories"]}
        assert not categories & outside, (name, categories)
        keyed = info["first_key_pos"] > 0 or "movablekeys" in info["flags"]
        assert keyed or info.get("subcommands"), name
    for name in (b"MULTI", b"EXEC", b"DISCARD", b"WATCH", b"UNWATCH", b"RESET", b"SELECT"):
        assert name in known
        assert name not in _DATA_COMMANDS


def test_a_blocks_results_are_on_its_as_target(client: redis.Redis) -> None:
    # given a block whose replies the caller reads through the name it wrote with
    token = hold(client)
    with guarded(client, KEYS, "42", token) as pipe:
        pipe.set("result:42", "done")
        pipe.incr("finished")
        inside = pipe.results
    # then they are there once it ended, as on the block itself
    assert inside is None
    assert pipe.results == [True, 1]
    # and a stale block has none
    stale = guarded(client, KEYS, "42", new_token())
    with pytest.raises(LockLost), stale as refused:
        refused.set("result:42", "stale")
    assert refused.results is None
    assert stale.results is None


def test_an_async_blocks_results_are_on_its_as_target(
    redis_client: redis.Redis, server: Server
) -> None:
    token = hold(redis_client)

    async def holder() -> list[Any] | None:
        client = redis.asyncio.Redis.from_url(server.url)
        try:
            async with guarded(client, KEYS, "42", token) as pipe:
                pipe.incr("finished")
            return pipe.results
        finally:
            await client.aclose()

    assert asyncio.run(holder()) == [1]


def test_release_of_a_lock_key_of_another_type_leaves_it(redis_client: redis.Redis) -> None:
    redis_client.hset(KEYS.lock("8"), "a", "b")
    assert release(redis_client, KEYS, "8", "token") is False
    assert redis_client.hgetall(KEYS.lock("8")) == {b"a": b"b"}


def test_a_server_that_refuses_the_read_is_an_error_not_a_loss(
    redis_client: redis.Redis, server: Server
) -> None:
    # given a user the server lets run scripts but not GET
    token = hold(redis_client)
    redis_client.execute_command("ACL", "SETUSER", "noget", "on", ">pw", "~*", "+@all", "-get")  # type: ignore[no-untyped-call]
    user = server.client(username="noget", password="pw")
    try:
        # then a fence is the server's error, not a stolen lock
        with pytest.raises(redis.ResponseError, match=r"(?i)permission"):
            fence(user, KEYS, "42", token)
    finally:
        user.close()
        redis_client.execute_command("ACL", "DELUSER", "noget")  # type: ignore[no-untyped-call]
    assert redis_client.hget(KEYS.key_prefix + "42", FENCE_FIELD) is None
    assert fence(redis_client, KEYS, "42", token) > 0


@pytest.mark.parametrize(
    ("make", "kind"),
    [
        (lambda c, k: c.set(k, "not a job"), "string"),
        (lambda c, k: c.rpush(k, "x"), "list"),
        (lambda c, k: c.sadd(k, "x"), "set"),
    ],
    ids=["string", "list", "set"],
)
def test_a_job_key_of_another_type_is_named_in_the_error(
    client: redis.Redis, make: Any, kind: str
) -> None:
    # given a held lock whose job key is no hash
    token = hold(client, job=False)
    make(client, KEYS.key_prefix + "42")
    # then the fence says which job, which key and what it holds, and changes nothing
    with pytest.raises(LookupError, match=rf"job '42' has no hash at 'emq:fences:42'.*a {kind}"):
        fence(client, KEYS, "42", token)
    assert client.type(KEYS.key_prefix + "42") in {kind, kind.encode()}


def test_a_fence_field_that_holds_no_number_is_an_error_naming_it(
    redis_client: redis.Redis,
) -> None:
    token = hold(redis_client)
    redis_client.hset(KEYS.key_prefix + "42", FENCE_FIELD, "twelve")
    with pytest.raises(redis.ResponseError, match="emq:fence of emq:fences:42 holds 'twelve'"):
        fence(redis_client, KEYS, "42", token)
    assert redis_client.hget(KEYS.key_prefix + "42", FENCE_FIELD) == b"twelve"


def test_fences_keep_counting_from_a_number_of_an_earlier_version(
    redis_client: redis.Redis,
) -> None:
    # given a job whose hash has a small number, as earlier versions counted from 1
    token = hold(redis_client)
    redis_client.hset(KEYS.key_prefix + "42", FENCE_FIELD, "7")
    # then the next is larger; and a number near the limit still counts up by one
    assert fence(redis_client, KEYS, "42", token) > 7
    redis_client.hset(KEYS.key_prefix + "42", FENCE_FIELD, str(2**53 - 3))
    assert fence(redis_client, KEYS, "42", token) == 2**53 - 2


def test_a_release_whose_answer_is_lost_never_says_false_for_its_own_delete(
    redis_client: redis.Redis, server: Server
) -> None:
    # Given a holder whose client retries a dropped connection, through a proxy
    # that lets the release's delete reach the server and then drops the connection
    token = hold(redis_client)
    with FaultProxy.to(server.url) as proxy:
        client = redis.Redis.from_url(proxy.url, retry=Retry(NoBackoff(), 3))
        assert client.ping()
        # what a release sends to delete: a script call, or a transaction's EXEC
        proxy.drop_reply_to("EVALSHA", "EVAL", "EXEC")

        # When it releases, then it learns the outcome is unknown, never "not deleted"
        with pytest.raises(redis.ConnectionError):
            release(client, KEYS, "42", token)
        # And a second call, whose answer arrives, says the lock no longer holds the token
        assert release(client, KEYS, "42", token) is False
        client.close()

    # And the lock was deleted once, by the first call
    assert proxy.cuts == 1
    assert not redis_client.exists(KEYS.lock("42"))


def test_an_async_release_whose_answer_is_lost_raises(
    redis_client: redis.Redis, server: Server
) -> None:
    token = hold(redis_client)

    async def holder(url: str) -> None:
        client = redis.asyncio.Redis.from_url(url, retry=AsyncRetry(NoBackoff(), 3))
        try:
            assert await client.ping()
            proxy.drop_reply_to("EVALSHA", "EVAL", "EXEC")
            with pytest.raises(redis.ConnectionError):
                await release(client, KEYS, "42", token)
        finally:
            await client.aclose()

    with FaultProxy.to(server.url) as proxy:
        asyncio.run(holder(proxy.url))

    assert proxy.cuts == 1
    assert not redis_client.exists(KEYS.lock("42"))


def test_release_retries_past_renewals_and_deletes(
    redis_client: redis.Redis, server: Server
) -> None:
    # given a lock renewed with its own token every millisecond
    token = hold(redis_client)
    stop = threading.Event()
    renewing = threading.Event()

    def renew() -> None:
        renewer = server.client()
        while not stop.is_set():
            if not renewer.set(KEYS.lock("42"), token, px=TTL_MS, xx=True):
                break
            renewing.set()
            time.sleep(0.001)
        renewer.close()

    thread = threading.Thread(target=renew, daemon=True)
    thread.start()
    try:
        assert renewing.wait(10)
        # then its holder's release still deletes it, and says so
        assert release(redis_client, KEYS, "42", token) is True
    finally:
        stop.set()
        thread.join(10)
    assert not redis_client.exists(KEYS.lock("42"))
