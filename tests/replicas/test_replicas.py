"""Renewals confirmed by replicas: ``replicas=`` on a real primary and its replica.

A watched lock's deadline moves only on renewals the replicas confirmed
(``WAIT`` after the tick's script calls, in the same round trip). When the
replica is cut off, the primary goes on renewing, and the lease is told
``"unconfirmed"`` before the replica's copy of the lock, the one a failover
would serve, can expire.
"""

from __future__ import annotations

import asyncio
import pickle
import threading
import time
from typing import TYPE_CHECKING

import pytest
import redis
import redis.asyncio

import actors
from actors import NotReplicatedError, QueueKeys, Replicas, lease
from actors.connection import command_timeout
from actors.scripts import MAX_REPLICAS, REPLICA_TIMEOUT_MS, require_replicas
from actors.timing import Timing, default_safety_margin
from tests.support import Recorder, new_token, wait_for
from tests.support.fakes import LockTable
from tests.support.replication import ReplicatedPair

if TYPE_CHECKING:
    from collections.abc import Iterator

    from tests.support import Server
    from tests.support.server import Servers

KEYS = QueueKeys("replicas")
LOCK_MS = 2000
TIMING = Timing(LOCK_MS)
#: What a renewal may take per attempt with these windows, in ms.
LIMIT_MS = command_timeout(TIMING, default_safety_margin(TIMING)) * 1000
ISOLATIONS = ["thread", "process"]


def now_ms() -> int:
    return time.monotonic_ns() // 1_000_000


@pytest.fixture
def primary(pair: ReplicatedPair) -> Iterator[redis.Redis]:
    """A client of the primary, the replica in sync with it (again) and both flushed."""
    client = pair.client()
    pair.attach()
    pair.flush()
    try:
        yield client
    finally:
        client.close()


def take(client: redis.Redis, job_id: str = "job") -> str:
    token = new_token()
    assert client.set(KEYS.lock(job_id), token, px=LOCK_MS)
    return token


class Waiter:
    """A thread beside the job, waiting on its lease: when was it told?"""

    def __init__(self, held: actors.Lease, timeout: float) -> None:
        self.told: int | None = None
        self._timeout = timeout
        self.thread = threading.Thread(target=self._run, args=(held,), daemon=True)
        self.thread.start()

    def _run(self, held: actors.Lease) -> None:
        if held.wait(timeout=self._timeout):
            self.told = now_ms()

    def result(self) -> int | None:
        self.thread.join(self._timeout + 5)
        return self.told


# -- checked at the call --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("replicas", "error"),
    [
        (-1, ValueError),
        (MAX_REPLICAS + 1, ValueError),
        (True, TypeError),
        ("1", TypeError),
        (1.0, TypeError),
    ],
)
def test_a_bad_count_is_refused_at_the_call(
    pair: ReplicatedPair, replicas: object, error: type[Exception]
) -> None:
    with pytest.raises(error, match="replicas"):
        actors.start_link(connection=pair.primary.url, keys=KEYS, replicas=replicas)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"count": 1, "timeout": 0}, ValueError),  # WAIT's 0 waits for ever
        ({"count": 1, "timeout": -5}, ValueError),
        ({"count": 1, "timeout": 2.5}, TypeError),
        ({"count": 1, "aof": 1}, TypeError),
        ({"count": None}, TypeError),
    ],
)
def test_bad_replicas_fields_are_refused_when_built(
    fields: dict[str, object], error: type[Exception]
) -> None:
    with pytest.raises(error, match="replicas"):
        Replicas(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_timeout_that_does_not_fit_a_renewals_wait_is_refused(
    pair: ReplicatedPair, isolation: str
) -> None:
    # Half the wait per attempt: the other half is the calls' and the reply's.
    most = int(LIMIT_MS // 2)
    with pytest.raises(ValueError, match="replicas timeout must be at most"):
        actors.start_link(
            connection=pair.primary.url,
            keys=KEYS,
            lock_duration=LOCK_MS,
            replicas=Replicas(1, timeout=most + 1),
            isolation=isolation,
        )
    fits = actors.start_link(
        connection=pair.primary.url,
        keys=KEYS,
        lock_duration=LOCK_MS,
        replicas=Replicas(1, timeout=most),
        isolation=isolation,
    )
    actors.stop(fits)


def test_a_client_that_gives_up_before_the_wait_is_refused(pair: ReplicatedPair) -> None:
    client = redis.Redis.from_url(pair.primary.url, socket_timeout=0.05)
    with pytest.raises(ValueError, match="socket_timeout"):
        actors.start_link(connection=client, keys=KEYS, replicas=Replicas(1, timeout=100))
    client.close()


def test_a_renewer_of_ones_own_takes_no_replicas() -> None:
    with pytest.raises(TypeError, match="replicas"):
        actors.start_link(renewer=LockTable(), keys=KEYS, replicas=1)
    # 0 asks for nothing, so it is allowed with any renewer.
    actors.stop(actors.start_link(renewer=LockTable(), keys=KEYS, replicas=0))


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_waitaof_on_a_server_without_it_is_refused_at_the_call(
    servers: Servers, isolation: str
) -> None:
    old: Server = servers.get("redis")
    if old.engine == "url":
        pytest.skip("REDIS_URL names one server; Redis 6.2 is the one without WAITAOF")
    with pytest.raises(ValueError, match="WAITAOF"):
        actors.start_link(
            connection=old.url, keys=KEYS, replicas=Replicas(1, aof=True), isolation=isolation
        )


def test_the_default_timeout_fits_the_managers_windows() -> None:
    fitted = require_replicas(1, limit_ms=LIMIT_MS)
    assert fitted is not None
    assert fitted.timeout is not None
    assert 0 < fitted.timeout <= LIMIT_MS / 2
    assert require_replicas(1) == Replicas(1)
    assert Replicas(1).wait_ms == REPLICA_TIMEOUT_MS
    assert require_replicas(0) is None
    assert require_replicas(Replicas(0, timeout=5)) is None


def test_the_error_crosses_a_process_whole() -> None:
    error = NotReplicatedError(0, 2, 150, "WAITAOF")
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is NotReplicatedError
    assert (again.acked, again.wanted, again.timeout, again.command) == (0, 2, 150, "WAITAOF")
    assert (
        str(again) == str(error) == "0 of 2 replica(s) confirmed the write within 150 ms (WAITAOF)"
    )


# -- the plain call -------------------------------------------------------------------------


def test_extend_locks_raises_when_the_replicas_did_not_confirm(
    pair: ReplicatedPair, primary: redis.Redis
) -> None:
    token = take(primary)
    assert actors.extend_locks(primary, KEYS, ["job"], [token], LOCK_MS, replicas=1) == []
    with pytest.raises(NotReplicatedError) as raised:
        actors.extend_locks(
            primary, KEYS, ["job"], [token], LOCK_MS, replicas=Replicas(2, timeout=50)
        )
    assert (raised.value.acked, raised.value.wanted, raised.value.timeout) == (1, 2, 50)
    # The primary renewed it all the same: only the confirmation is missing.
    assert primary.pttl(KEYS.lock("job")) > LOCK_MS - 200


def test_waitaof_counts_only_replicas_that_wrote_their_append_only_file(
    pair: ReplicatedPair, primary: redis.Redis
) -> None:
    token = take(primary)
    # The replica keeps no append-only file, so it never confirms an fsync.
    with pytest.raises(NotReplicatedError, match="WAITAOF") as raised:
        actors.extend_locks(
            primary, KEYS, ["job"], [token], LOCK_MS, replicas=Replicas(1, timeout=50, aof=True)
        )
    assert raised.value.acked == 0


# -- the manager ----------------------------------------------------------------------------


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_lease_renewed_with_its_replica_in_sync_holds(
    pair: ReplicatedPair, primary: redis.Redis, isolation: str
) -> None:
    token = take(primary)
    reports = Recorder()
    manager = reports.start(
        pair.primary.url, KEYS, lock_duration=LOCK_MS, replicas=1, isolation=isolation
    )
    try:
        with lease(manager, "job", token) as held:
            since = time.monotonic()
            # Past several trust windows: each renewal must have been confirmed.
            wait_for(
                lambda: reports.renewed(since)["job"] >= 8,
                8 * LOCK_MS / 1000,
                "eight confirmed renewals",
            )
            assert not held.lost
            assert reports.errors() == []
        with pair.replica_client() as replica:
            assert replica.get(KEYS.lock("job")) is not None  # what the primary renewed, replicated
    finally:
        actors.stop(manager)


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_replica_cut_off_the_lease_is_told_before_the_replicas_copy_expires(
    pair: ReplicatedPair, primary: redis.Redis, isolation: str
) -> None:
    # Given a leased job and a plain tracked one, renewed with the replica's confirmation
    token, plain = take(primary), take(primary, "plain")
    reports = Recorder()
    manager = reports.start(
        pair.primary.url, KEYS, lock_duration=LOCK_MS, replicas=1, isolation=isolation
    )
    try:
        actors.track_job(manager, "plain", plain)
        with lease(manager, "job", token) as held:
            since = time.monotonic()
            wait_for(lambda: reports.renewed(since)["job"] >= 2, 4 * LOCK_MS / 1000, "renewals")
            watch = Waiter(held, timeout=4 * LOCK_MS / 1000)
            # When the replica is cut off: it keeps the lock as the last
            # renewal it received left it, while the primary renews on
            pair.detach()
            with pair.replica_client() as replica:
                before = now_ms()
                expired = before + int(replica.pttl(KEYS.lock("job")))
            told = watch.result()
            # Then the lease heard before that copy could expire
            assert told is not None, "the lease was never told"
            assert told < expired, f"told {told - expired} ms after the replica's copy expired"
            assert held.reason == "unconfirmed"
            with pytest.raises(actors.LockLost, match=r"0 of 1 replica\(s\) confirmed"):
                held.check()
            # The manager reports it too (held here: the lease's exit would untrack it first)
            reports.wait(reports.lost, 2 * LOCK_MS / 1000, "the manager's report of the loss")
        # And the primary renewed all along: a plain job stays tracked and renewed
        assert actors.is_tracked(manager, "plain")
        assert primary.pttl(KEYS.lock("plain")) > LOCK_MS // 2
        assert any(isinstance(error, NotReplicatedError) for error in reports.errors())
        [lost] = reports.lost()
        assert (lost.job_id, lost.reason) == ("job", "unconfirmed")
        assert "0 of 1 replica(s) confirmed" in lost.detail
        assert not [lost for lost in reports.lost() if lost.job_id == "plain"]
    finally:
        actors.stop(manager)


def test_without_replicas_a_cut_off_replica_goes_unnoticed(
    pair: ReplicatedPair, primary: redis.Redis
) -> None:
    # The gap the option closes: the same cut, the primary's word alone.
    token = take(primary)
    manager = actors.start_link(connection=pair.primary.url, keys=KEYS, lock_duration=LOCK_MS)
    try:
        with lease(manager, "job", token) as held:
            pair.detach()
            with pair.replica_client() as replica:
                expired = now_ms() + int(replica.pttl(KEYS.lock("job")))
            # Well past the replica's copy: a failover now would hand the job on.
            assert not held.wait(timeout=(expired - now_ms() + TIMING.interval) / 1000)
            assert replica_lost(pair)
    finally:
        actors.stop(manager)


def replica_lost(pair: ReplicatedPair) -> bool:
    with pair.replica_client() as replica:
        return replica.get(KEYS.lock("job")) is None


# -- the lock helpers -----------------------------------------------------------------------

CONFIRM = Replicas(1, timeout=50)


def test_a_fence_is_handed_out_once_the_replica_confirmed_it(
    pair: ReplicatedPair, primary: redis.Redis
) -> None:
    token = take(primary)
    primary.hset(KEYS.key_prefix + "job", "name", "x")
    first = actors.fence(primary, KEYS, "job", token, replicas=1)
    with pair.replica_client() as replica:
        # Confirmed: the replica holds the number already, no wait needed.
        assert int(replica.hget(KEYS.key_prefix + "job", "emq:fence") or 0) == first
    pair.detach()
    with pytest.raises(NotReplicatedError) as raised:
        actors.fence(primary, KEYS, "job", token, replicas=CONFIRM)
    assert (raised.value.acked, raised.value.wanted, raised.value.timeout) == (0, 1, 50)


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_leases_fence_waits_for_its_managers_replicas(
    pair: ReplicatedPair, primary: redis.Redis, isolation: str
) -> None:
    # Catches: a lease's fence taken on the primary's word alone, beside a
    # manager whose renewals the replicas confirm: a failover could hand the
    # next holder a number no higher than this one.
    token = take(primary)
    primary.hset(KEYS.key_prefix + "job", "name", "x")
    confirm = Replicas(1, timeout=100)
    manager = actors.start_link(
        connection=pair.primary.url,
        keys=KEYS,
        lock_duration=LOCK_MS,
        replicas=confirm,
        isolation=isolation,
    )
    try:
        assert manager.replicas == confirm
        with lease(manager, "job", token) as held:
            pair.detach()
            with pytest.raises(NotReplicatedError, match=r"0 of 1 replica\(s\) confirmed"):
                held.fence  # noqa: B018
            pair.attach()
            number = held.fence
            with pair.replica_client() as replica:
                assert int(replica.hget(KEYS.key_prefix + "job", "emq:fence") or 0) == number
    finally:
        actors.stop(manager)


def test_a_lost_lock_is_said_before_the_replicas(primary: redis.Redis) -> None:
    take(primary)
    primary.hset(KEYS.key_prefix + "job", "name", "x")
    with pytest.raises(actors.LockLost, match="stolen"):
        actors.fence(primary, KEYS, "job", new_token(), replicas=CONFIRM)


def test_a_release_and_a_guarded_write_wait_for_the_replica(
    pair: ReplicatedPair, primary: redis.Redis
) -> None:
    token = take(primary)
    with actors.guarded(primary, KEYS, "job", token, replicas=1) as pipe:
        pipe.set("result", "done")
    assert pipe.results == [True]
    assert actors.release(primary, KEYS, "job", token, replicas=1)
    with pair.replica_client() as replica:
        # Both confirmed: the replica has them already.
        assert replica.get("result") == b"done"
        assert replica.get(KEYS.lock("job")) is None


def test_a_guarded_write_the_replica_did_not_confirm_raises_after_it_applied(
    pair: ReplicatedPair, primary: redis.Redis
) -> None:
    token = take(primary)
    pair.detach()
    with (
        pytest.raises(NotReplicatedError),
        actors.guarded(primary, KEYS, "job", token, replicas=CONFIRM) as pipe,
    ):
        pipe.set("result", "done")
    assert pipe.results == [True]
    assert primary.get("result") == b"done"
    with pytest.raises(NotReplicatedError):
        actors.release(primary, KEYS, "job", token, replicas=CONFIRM)
    assert primary.get(KEYS.lock("job")) is None
    # The connection the wait used went back to the pool in step: it still answers.
    assert primary.ping()


def test_the_helpers_wait_for_the_replica_on_asyncio(
    pair: ReplicatedPair, primary: redis.Redis
) -> None:
    asyncio.run(asyncio_helpers(pair, primary))


async def asyncio_helpers(pair: ReplicatedPair, primary: redis.Redis) -> None:
    token = take(primary)
    primary.hset(KEYS.key_prefix + "job", "name", "x")
    client = redis.asyncio.Redis.from_url(pair.primary.url, socket_timeout=10)
    try:
        number = await actors.fence(client, KEYS, "job", token, replicas=1)
        async with actors.guarded(client, KEYS, "job", token, replicas=1) as pipe:
            pipe.set("result", str(number))
        assert await actors.release(client, KEYS, "job", token, replicas=1)
        with pair.replica_client() as replica:
            assert replica.get("result") == str(number).encode()
        pair.detach()
        token = take(primary)
        with pytest.raises(NotReplicatedError):
            await actors.fence(client, KEYS, "job", token, replicas=CONFIRM)
        with pytest.raises(NotReplicatedError):
            async with actors.guarded(client, KEYS, "job", token, replicas=CONFIRM) as pipe:
                pipe.set("result", "late")
        with pytest.raises(NotReplicatedError):
            await actors.release(client, KEYS, "job", token, replicas=CONFIRM)
        assert await client.ping()
    finally:
        await client.aclose()


@pytest.mark.parametrize("helper", ["fence", "release", "guarded"])
def test_a_helpers_bad_replicas_are_refused_at_the_call(primary: redis.Redis, helper: str) -> None:
    token = take(primary)
    call = getattr(actors, helper)
    with pytest.raises(ValueError, match="replicas count"):
        call(primary, KEYS, "job", token, replicas=-1)
    with pytest.raises(TypeError, match="replicas"):
        call(primary, KEYS, "job", token, replicas="1")
    assert primary.get(KEYS.lock("job")) == token.encode()  # nothing was sent
