"""Hostile callers and servers against ``replicas=``: odd numbers, dropped links, refusals."""

from __future__ import annotations

import enum
import threading
from typing import TYPE_CHECKING

import pytest
import redis

import actors
from actors import QueueKeys, Replicas
from actors.connection import command_timeout
from actors.timing import Timing, default_safety_margin
from tests.support import new_token, wait_for
from tests.support.replication import ReplicatedPair

if TYPE_CHECKING:
    from collections.abc import Iterator

    from tests.support.server import Servers

KEYS = QueueKeys("attack")
LOCK_MS = 4000
TIMING = Timing(LOCK_MS)
LIMIT_MS = command_timeout(TIMING, default_safety_margin(TIMING)) * 1000


class Count(enum.IntEnum):
    ONE = 1
    HUNDRED_MS = 100


@pytest.fixture
def primary(pair: ReplicatedPair) -> Iterator[redis.Redis]:
    client = pair.client()
    pair.attach()
    pair.flush()
    try:
        yield client
    finally:
        client.close()


def take(client: redis.Redis, job_id: str = "job", px: int = 60_000) -> str:
    token = new_token()
    assert client.set(KEYS.lock(job_id), token, px=px)
    return token


def test_an_int_enum_count_and_timeout_are_sent_as_numbers(primary: redis.Redis) -> None:
    # require_int copies an IntEnum to a plain int, but Replicas.__post_init__
    # drops the copy: WAIT is sent "<Count.ONE: 1>" and the server refuses it.
    assert type(Replicas(Count.ONE).count) is int
    token = take(primary)
    for replicas in (Count.ONE, Replicas(1, timeout=Count.HUNDRED_MS)):
        assert actors.extend_locks(primary, KEYS, ["job"], [token], 60_000, replicas=replicas) == []


def test_the_longest_timeout_accepted_leaves_room_for_the_reply(
    pair: ReplicatedPair, primary: redis.Redis
) -> None:
    # The longest wait the call takes is half the wait per attempt: WAIT and
    # the round trip end before the client gives up, so each tick says the
    # replica's shortfall, never "server unreachable" (a reconnect and a resend).
    token = take(primary, px=LOCK_MS)
    errors: list[BaseException] = []
    manager = actors.start_link(
        connection=pair.primary.url,
        keys=KEYS,
        lock_duration=LOCK_MS,
        replicas=Replicas(1, timeout=int(LIMIT_MS // 2)),
        on_error=errors.append,
    )
    try:
        actors.track_job(manager, "job", token)
        pair.detach()
        wait_for(lambda: len(errors) >= 3, 5, "three failed ticks")
    finally:
        actors.stop(manager)
    kinds = {type(error).__name__ for error in errors}
    assert kinds == {"NotReplicatedError"}, [f"{type(e).__name__}: {e}" for e in errors]


def kill_the_wait(client: redis.Redis, timeout: float = 10.0) -> threading.Thread:
    """Kill, from another connection, the client blocked in WAIT, once it is."""

    def waiting() -> list[str]:
        return [seen["id"] for seen in client.client_list() if seen.get("cmd") == "wait"]

    def kill() -> None:
        for found in wait_for(waiting, timeout, "a client blocked in WAIT"):
            client.client_kill_filter(_id=found)

    thread = threading.Thread(target=kill, daemon=True)
    thread.start()
    return thread


def test_a_connection_lost_during_the_wait_says_the_writes_applied(
    pair: ReplicatedPair, primary: redis.Redis
) -> None:
    # EXEC answered: the writes applied. The link then drops during WAIT: the
    # caller hears "applied, not confirmed", not a bare ConnectionError that
    # says "maybe nothing ran" (a release retried on it would answer False for
    # a lock it deleted itself).
    token = take(primary)
    pair.detach()
    outcomes = []
    killer = kill_the_wait(primary)
    try:
        with actors.guarded(
            primary, KEYS, "job", token, replicas=Replicas(1, timeout=3000)
        ) as pipe:
            pipe.set("result", "done")
    except redis.RedisError as exc:
        outcomes.append(("guarded", type(exc).__name__, primary.get("result")))
    killer.join()
    killer = kill_the_wait(primary)
    try:
        actors.release(primary, KEYS, "job", token, replicas=Replicas(1, timeout=3000))
    except redis.RedisError as exc:
        outcomes.append(("release", type(exc).__name__, primary.get(KEYS.lock("job"))))
    killer.join()
    assert outcomes == [
        ("guarded", "NotReplicatedError", b"done"),
        ("release", "NotReplicatedError", None),
    ]


def test_waitaof_is_refused_before_a_helper_writes(servers: Servers) -> None:
    # As start_link does, the helpers refuse aof=True on Redis 6.2 before they write.
    old = servers.get("redis")
    if old.engine == "url":
        pytest.skip("REDIS_URL names one server")
    client = old.client()
    client.flushall()
    token = take(client)
    with pytest.raises(ValueError, match="WAITAOF"):
        actors.release(client, KEYS, "job", token, replicas=Replicas(1, timeout=50, aof=True))
    assert client.get(KEYS.lock("job")) == token.encode()
    client.close()


def test_a_wait_the_server_refuses_is_refused_at_the_call(
    pair: ReplicatedPair, primary: redis.Redis
) -> None:
    # Refused at the call, naming the option: not every tick failing, and
    # every watched lock lost "unconfirmed".
    primary.execute_command("ACL", "SETUSER", "nowait", "on", ">pw", "~*", "+@all", "-wait")  # type: ignore[no-untyped-call]
    url = f"redis://nowait:pw@{pair.primary.host}:{pair.primary.port}"
    try:
        with pytest.raises(ValueError, match="WAIT"):
            actors.stop(actors.start_link(connection=url, keys=KEYS, replicas=1))
    finally:
        primary.execute_command("ACL", "DELUSER", "nowait")  # type: ignore[no-untyped-call]
