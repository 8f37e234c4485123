"""Our extendLocks-1.lua against BullMQ's own, on identical copies of random states.

Hypothesis draws a batch of jobs, each with a lock state (held by the token,
held by another, missing; with or without a TTL) and stalled-set membership,
with or without other members in the stalled set (or no stalled set at all).
The same state is written to two databases of one server; our script runs on
one and the script shipped in the PyPI ``bullmq`` package on the other. The
returned ids, or the fact of an error, and every resulting key must match
(TTLs within a tolerance). That holds for good input and for bad: TTLs the
server cannot use, malformed msgpack, arrays of different lengths, ids and
tokens that are not strings. Batches often name a job more than once, each
time with its own token, and :func:`actors.extend_locks` as a whole (its
read-back of the reported locks and its chunking included) must return what
BullMQ's script returns.

Two differences are deliberate, and each has its own test:

- A lock key of another type (a hash, a list, ...) is a lost lock in ours,
  like a lock held by another token: the job is reported and the rest of the
  call is renewed. BullMQ's GET raises WRONGTYPE and ends the whole call.
  This is the one difference in what a call does to the keys.
- A TTL that is 0 or below, or not an integer, is refused by ours up front
  with an error, even when no lock matches. BullMQ's ``SET ... PX`` refuses
  it only at the first held lock, so when no lock matches it reports every
  id. Neither changes a key.
"""

from __future__ import annotations

import re
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from typing import Any

import msgpack
import pytest
import redis
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from redis.exceptions import ResponseError

from actors import QueueKeys, extend_locks
from actors.scripts import script_source
from tests.conftest import Server

pytestmark = pytest.mark.both_engines

KEYS = QueueKeys("diff")
#: How far two copies' TTLs may differ beyond the time between their writing
#: and their reading (the copies are written, run and read one after the
#: other, so each key's age differs by at most that).
TTL_TOLERANCE_MS = 50
#: When the last few states were written (an example writes at most three).
_WRITES: deque[float] = deque(maxlen=3)
#: What a held lock's token is not: the value a "theirs" lock holds.
OTHER_TOKEN = b"someone-else"
#: Lock states that give the lock key another type than a string.
WRONG_TYPES = ("hash", "list", "set", "zset")
#: The TTLs our script accepts: what the server parses as a positive integer.
POSITIVE_INT = re.compile(r"[1-9][0-9]*")
#: 2**63 - 1, the server's largest expiry time in milliseconds.
LLONG_MAX = 2**63 - 1

job_ids = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=12
)
#: Ids of one batch: often drawn from a few, so that a batch names a job
#: more than once (each time with its own token, as BullMQ's script allows).
batch_ids = st.one_of(job_ids, st.sampled_from(["0", "1", "dup"]))
lock_states = st.sampled_from(["ours", "theirs", "missing", "ours-persistent"])
jobs = st.lists(
    st.tuples(batch_ids, lock_states, st.booleans(), st.integers(5000, 60000)), max_size=12
)
jobs_with_wrong_types = st.lists(
    st.tuples(
        job_ids,
        st.sampled_from(["ours", "theirs", "missing", *WRONG_TYPES]),
        st.booleans(),
        st.integers(5000, 60000),
    ),
    min_size=1,
    max_size=12,
    unique_by=lambda job: job[0],  # a later lock of the same id would overwrite it
).filter(lambda batch: any(state in WRONG_TYPES for _, state, *_ in batch))
bad_ttls = st.one_of(
    st.integers(-(2**70), 0).map(str),
    st.floats().map(str),
    st.from_regex(r"\A([+ 0]|-0)[0-9]{1,6}\Z"),
    st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=8),
).filter(lambda ttl: not POSITIVE_INT.fullmatch(ttl))
# Positive integers near and past what the server can add to its clock: some
# it accepts, some make SET and PEXPIRE fail alike, some it cannot parse.
huge_ttls = st.integers(LLONG_MAX - 10**13, 10**22)

Batch = list[tuple[str, str, bool, int]]


@dataclass(frozen=True)
class Failed:
    """A script call that the server answered with an error."""

    message: str


@dataclass(frozen=True)
class Entry:
    """A key as read back: its type, its contents and its PTTL."""

    kind: str
    value: object
    pttl: int


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


def write_lock(client: redis.Redis, job_id: str, state: str, token: str, ttl: int) -> None:
    key = KEYS.lock(job_id)
    if state == "ours":
        client.set(key, token, px=ttl)
    elif state == "ours-persistent":
        client.set(key, token)
    elif state == "theirs":
        client.set(key, OTHER_TOKEN, px=ttl)
    elif state in WRONG_TYPES:
        client.delete(key)
        if state == "hash":
            client.hset(key, "token", token)
        elif state == "list":
            client.rpush(key, token)
        elif state == "set":
            client.sadd(key, token)
        else:
            client.zadd(key, {token: 1})
        client.pexpire(key, ttl)


def write_state(
    client: redis.Redis, batch: Batch, bystander: bool, *, wrong_as: str | None = None
) -> list[str]:
    """Write ``batch`` to a flushed database and return each job's token.

    ``wrong_as`` replaces every lock of another type by a lock in that state.
    """
    _WRITES.append(time.monotonic())
    client.flushdb()
    tokens = []
    for index, (job_id, state, stalled, ttl) in enumerate(batch):
        token = f"token-{index}-{job_id}"
        tokens.append(token)
        written = wrong_as if wrong_as is not None and state in WRONG_TYPES else state
        write_lock(client, job_id, written, token, ttl)
        if stalled:
            client.sadd(KEYS.stalled, job_id)
    if bystander:
        client.sadd(KEYS.stalled, "bystander")
    return tokens


def read_key(client: redis.Redis, key: bytes) -> Entry:
    raw = client.type(key)
    kind = raw.decode() if isinstance(raw, bytes) else str(raw)
    value: object
    if kind == "string":
        value = client.get(key)
    elif kind == "set":
        value = client.smembers(key)
    elif kind == "hash":
        value = client.hgetall(key)
    elif kind == "list":
        value = client.lrange(key, 0, -1)
    elif kind == "zset":
        value = client.zrange(key, 0, -1, withscores=True)
    else:
        raise AssertionError(f"unexpected key type {kind} at {key!r}")
    return Entry(kind, value, client.pttl(key))


def snapshot(client: redis.Redis) -> dict[bytes, Entry]:
    return {key: read_key(client, key) for key in client.scan_iter(count=1000)}


def assert_same_entry(ours: Entry, theirs: Entry, key: bytes) -> None:
    assert (ours.kind, ours.value) == (theirs.kind, theirs.value), key
    assert (ours.pttl == -1) == (theirs.pttl == -1), key
    # A loaded machine may take a while between writing and reading: that
    # time is the drift allowed, and the tolerance stays tight when it is fast.
    drift = (time.monotonic() - min(_WRITES)) * 1000 if _WRITES else 0.0
    assert abs(ours.pttl - theirs.pttl) <= TTL_TOLERANCE_MS + drift, key


def assert_same_keys(ours: dict[bytes, Entry], theirs: dict[bytes, Entry]) -> None:
    assert ours.keys() == theirs.keys()
    for key, entry in ours.items():
        assert_same_entry(entry, theirs[key], key)


def call(client: redis.Redis, source: str, tokens: bytes, ids: bytes, ttl: object) -> Any:
    """Run ``source`` with raw arguments; an error reply comes back as :class:`Failed`."""
    try:
        return client.eval(source, 1, KEYS.stalled, KEYS.key_prefix, tokens, ids, ttl)  # type: ignore[arg-type]
    except ResponseError as exc:
        return Failed(str(exc))


def run(client: redis.Redis, source: str, ids: list[str], tokens: list[str], ttl: object) -> Any:
    return call(client, source, msgpack.packb(tokens), msgpack.packb(ids), ttl)


def assert_same_outcome(ours: Any, theirs: Any) -> None:
    """Equal replies, or an error from both (their texts differ in line numbers)."""
    if isinstance(ours, Failed) or isinstance(theirs, Failed):
        assert isinstance(ours, Failed) and isinstance(theirs, Failed), (ours, theirs)
    else:
        assert ours == theirs


def held_somewhere(client: redis.Redis, ids: list[str], tokens: list[str]) -> bool:
    return any(
        client.get(KEYS.lock(job_id)) == token.encode()
        for job_id, token in zip(ids, tokens, strict=True)
    )


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(batch=jobs, ttl=st.integers(1000, 120000), bystander=st.booleans())
def test_our_script_behaves_exactly_like_bullmqs(
    databases: tuple[redis.Redis, redis.Redis],
    batch: Batch,
    ttl: int,
    bystander: bool,
) -> None:
    ours, theirs = databases
    ids = [job_id for job_id, *_ in batch]
    tokens = write_state(ours, batch, bystander)
    write_state(theirs, batch, bystander)

    our_reply = run(ours, script_source(), ids, tokens, ttl)
    their_reply = run(theirs, bullmq_script(), ids, tokens, ttl)

    assert not isinstance(our_reply, Failed)
    assert our_reply == their_reply
    assert_same_keys(snapshot(ours), snapshot(theirs))


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    batch=jobs,
    ttl=st.integers(1000, 120000),
    bystander=st.booleans(),
    max_batch=st.sampled_from([None, 1, 2, 5]),
)
def test_extend_locks_returns_what_bullmqs_script_returns(
    databases: tuple[redis.Redis, redis.Redis],
    batch: Batch,
    ttl: int,
    bystander: bool,
    max_batch: int | None,
) -> None:
    # The whole call, read-back of the reported locks included, in one script
    # call or in chunks: duplicate ids are reported per entry, as BullMQ does.
    ours, theirs = databases
    ids = [job_id for job_id, *_ in batch]
    tokens = write_state(ours, batch, bystander)
    write_state(theirs, batch, bystander)
    event("duplicate ids" if len(set(ids)) < len(ids) else "unique ids")

    failed = extend_locks(ours, KEYS, ids, tokens, ttl, max_batch=max_batch)
    their_reply = run(theirs, bullmq_script(), ids, tokens, ttl)

    assert [job_id.encode() for job_id in failed] == their_reply
    assert_same_keys(snapshot(ours), snapshot(theirs))


@settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(batch=jobs, ttl=huge_ttls, bystander=st.booleans())
def test_a_ttl_the_server_cannot_add_to_its_clock_fails_as_in_bullmqs(
    databases: tuple[redis.Redis, redis.Redis],
    batch: Batch,
    ttl: int,
    bystander: bool,
) -> None:
    # PEXPIRE and SET ... PX accept and refuse the same positive integers, at
    # the same point (the first held lock), with no key changed.
    ours, theirs = databases
    ids = [job_id for job_id, *_ in batch]
    tokens = write_state(ours, batch, bystander)
    write_state(theirs, batch, bystander)

    our_reply = run(ours, script_source(), ids, tokens, str(ttl))
    their_reply = run(theirs, bullmq_script(), ids, tokens, str(ttl))

    assert_same_outcome(our_reply, their_reply)
    assert_same_keys(snapshot(ours), snapshot(theirs))


@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(batch=jobs, ttl=bad_ttls, bystander=st.booleans())
def test_a_ttl_that_is_not_a_positive_integer_is_refused_up_front(
    databases: tuple[redis.Redis, redis.Redis],
    batch: Batch,
    ttl: str,
    bystander: bool,
) -> None:
    # The deliberate difference: BullMQ's SET ... PX refuses such a TTL only
    # at the first lock that holds its token, so a call in which no lock
    # matches reports every id. Ours refuses every such call up front. Neither
    # ever changes a key (PEXPIRE alone would delete a lock for a TTL <= 0).
    ours, theirs = databases
    ids = [job_id for job_id, *_ in batch]
    tokens = write_state(ours, batch, bystander)
    write_state(theirs, batch, bystander)
    before = snapshot(ours)
    any_held = held_somewhere(ours, ids, tokens)

    our_reply = run(ours, script_source(), ids, tokens, ttl)
    their_reply = run(theirs, bullmq_script(), ids, tokens, ttl)

    assert isinstance(our_reply, Failed)
    assert "ARGV[4] must be the lock TTL" in our_reply.message
    if any_held:
        assert isinstance(their_reply, Failed)
    else:
        assert their_reply == [job_id.encode() for job_id in ids]
    after = snapshot(ours)
    assert_same_keys(after, before)
    assert_same_keys(after, snapshot(theirs))


@pytest.mark.parametrize("ttl", ["0", "-1", "-30000", "1.5", "1e3", "+5", "05", " 5", "", "x"])
def test_a_bad_ttl_fails_in_both_when_a_lock_matches(
    databases: tuple[redis.Redis, redis.Redis], ttl: str
) -> None:
    ours, theirs = databases
    batch: Batch = [("j1", "theirs", True, 5000), ("j2", "ours", True, 5000)]
    tokens = write_state(ours, batch, bystander=True)
    write_state(theirs, batch, bystander=True)
    before = snapshot(ours)

    our_reply = run(ours, script_source(), ["j1", "j2"], tokens, ttl)
    their_reply = run(theirs, bullmq_script(), ["j1", "j2"], tokens, ttl)

    assert isinstance(our_reply, Failed) and isinstance(their_reply, Failed)
    assert_same_keys(snapshot(ours), before)
    assert_same_keys(snapshot(theirs), before)


@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(batch=jobs_with_wrong_types, ttl=st.integers(1000, 120000), bystander=st.booleans())
def test_a_lock_key_of_another_type_is_a_lock_held_by_another(
    databases: tuple[redis.Redis, redis.Redis],
    batch: Batch,
    ttl: int,
    bystander: bool,
) -> None:
    # The one deliberate difference in what a call does: BullMQ's GET raises
    # WRONGTYPE there and ends the call, so the jobs before that key are
    # renewed but never reported and the jobs after it are left to expire.
    # Ours treats the key exactly as BullMQ treats a lock holding another
    # token: the oracle is BullMQ's script on the same state with every such
    # key replaced by a string lock of another token.
    ours, theirs = databases
    ids = [job_id for job_id, *_ in batch]
    tokens = write_state(theirs, batch, bystander)
    assert isinstance(run(theirs, bullmq_script(), ids, tokens, ttl), Failed)

    write_state(ours, batch, bystander)
    write_state(theirs, batch, bystander, wrong_as="theirs")
    before = snapshot(ours)
    our_reply = run(ours, script_source(), ids, tokens, ttl)
    oracle_reply = run(theirs, bullmq_script(), ids, tokens, ttl)

    assert not isinstance(our_reply, Failed)
    assert our_reply == oracle_reply
    after, oracle = snapshot(ours), snapshot(theirs)
    assert after.keys() == oracle.keys()
    for key, entry in after.items():
        if entry.kind in WRONG_TYPES and key != KEYS.stalled.encode():
            assert_same_entry(entry, before[key], key)  # left exactly as it was
            assert oracle[key].value == OTHER_TOKEN
        else:
            assert_same_entry(entry, oracle[key], key)


lock_ids = st.one_of(job_ids, st.integers(-1000, 1000).map(str))
#: Anything msgpack can carry, as an element of an id or token array.
odd_elements = st.one_of(
    job_ids,
    st.integers(-(2**63), 2**64 - 1),
    st.floats(),
    st.booleans(),
    st.none(),
    st.binary(max_size=8),
    st.lists(st.integers(-(2**63), 2**64 - 1), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(-(2**63), 2**64 - 1), max_size=2),
)
msgpack_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(), job_ids),
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(st.text(max_size=3), children, max_size=3)
    ),
    max_leaves=8,
)


def as_number(job_id: str) -> object:
    """The id as msgpack's integer when it is one: Lua writes it back the same."""
    return int(job_id) if re.fullmatch(r"-?[1-9][0-9]*|0", job_id) else job_id


@st.composite
def odd_arguments(draw: st.DrawFn) -> tuple[Batch, bytes, bytes]:
    """A batch of locks and packed arrays that may be anything but well formed."""
    held: Batch = draw(
        st.lists(
            st.tuples(lock_ids, lock_states, st.booleans(), st.integers(5000, 60000)),
            max_size=6,
            unique_by=lambda job: job[0],
        )
    )
    known = [job_id for job_id, *_ in held]
    element = (
        st.one_of(
            st.sampled_from(known),
            st.sampled_from(known),
            st.sampled_from(known).map(as_number),
            odd_elements,
        )
        if known
        else odd_elements
    )
    ids: list[object] = draw(st.lists(element, max_size=8))
    tokens: list[object] = []
    for job_id in ids:
        name = str(job_id) if type(job_id) is int else job_id
        held_by = f"token-{known.index(name)}-{name}" if name in known else None
        tokens.append(held_by if held_by is not None else draw(odd_elements))
    change = draw(st.integers(-3, 3))
    if change < 0:
        tokens = tokens[:change]
    else:
        tokens += draw(st.lists(odd_elements, min_size=change, max_size=change))

    def packed(values: list[object]) -> st.SearchStrategy[bytes]:
        whole = msgpack.packb(values)
        return st.one_of(
            st.just(whole),
            st.just(whole),
            st.just(whole),
            st.integers(0, max(len(whole) - 1, 0)).map(lambda cut: whole[:cut]),
            msgpack_values.map(msgpack.packb),
            st.binary(max_size=12),
        )

    return held, draw(packed(tokens)), draw(packed(ids))


def assert_same_as_bullmq_on(
    databases: tuple[redis.Redis, redis.Redis], batch: Batch, tokens: bytes, ids: bytes
) -> Any:
    """Run both scripts on copies of ``batch``, compare, and return our outcome."""
    ours, theirs = databases
    write_state(ours, batch, bystander=True)
    write_state(theirs, batch, bystander=True)

    our_reply = call(ours, script_source(), tokens, ids, 30000)
    their_reply = call(theirs, bullmq_script(), tokens, ids, 30000)

    assert_same_outcome(our_reply, their_reply)
    assert_same_keys(snapshot(ours), snapshot(theirs))
    return our_reply


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(arguments=odd_arguments())
def test_malformed_arrays_fail_or_pass_as_in_bullmqs(
    databases: tuple[redis.Redis, redis.Redis], arguments: tuple[Batch, bytes, bytes]
) -> None:
    batch, tokens, ids = arguments
    outcome = assert_same_as_bullmq_on(databases, batch, tokens, ids)
    event("error" if isinstance(outcome, Failed) else "reply: " + ("some" if outcome else "none"))


HELD: Batch = [("1", "ours", True, 5000), ("7", "ours", True, 5000), ("x", "ours", True, 5000)]
TOKENS = [f"token-{index}-{job_id}" for index, (job_id, *_) in enumerate(HELD)]


@pytest.mark.parametrize(
    ("tokens", "ids"),
    [
        pytest.param(TOKENS[:1], ["1", "7", "x"], id="fewer-tokens-than-ids"),
        pytest.param([*TOKENS, "spare"], ["1", "7", "x"], id="more-tokens-than-ids"),
        pytest.param(TOKENS, [1, 7, "x"], id="integer-ids"),
        pytest.param([1, TOKENS[1], None], ["1", "7", "x"], id="non-string-tokens"),
        pytest.param(TOKENS, ["1", True, "x"], id="boolean-id"),
        pytest.param(TOKENS, ["1", None, "x"], id="nil-id"),
        pytest.param(TOKENS, ["1", ["7"], "x"], id="array-id"),
        pytest.param(TOKENS, {"a": "1"}, id="ids-a-map"),
        pytest.param(TOKENS, "17x", id="ids-a-string"),
        pytest.param(TOKENS, 7, id="ids-a-number"),
    ],
)
def test_odd_arrays_fail_or_pass_as_in_bullmqs(
    databases: tuple[redis.Redis, redis.Redis], tokens: object, ids: object
) -> None:
    assert_same_as_bullmq_on(databases, HELD, msgpack.packb(tokens), msgpack.packb(ids))


@pytest.mark.parametrize("payload", [b"\xc1", b"", b"\x92\xa1x", b"\x93\xa1x\xa1y"])
def test_malformed_msgpack_fails_in_both_and_changes_nothing(
    databases: tuple[redis.Redis, redis.Redis], payload: bytes
) -> None:
    ours, _ = databases
    ids = msgpack.packb(["1", "7", "x"])

    assert isinstance(assert_same_as_bullmq_on(databases, HELD, payload, ids), Failed)
    assert isinstance(
        assert_same_as_bullmq_on(databases, HELD, msgpack.packb(TOKENS), payload), Failed
    )
    before = snapshot(ours)
    assert isinstance(call(ours, script_source(), payload, payload, 30000), Failed)
    assert_same_keys(snapshot(ours), before)
