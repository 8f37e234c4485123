"""Abort before steal: the fault matrix of a leased job against a second worker.

Each scenario holds one job through a lease on a real server, injects one
fault, and races a second worker that tries ``SET NX`` on the job's lock
every 2 ms (from another process when this one cannot run). It measures,
from the moment of the fault, in milliseconds on the system's monotonic
clock (shared by every process): when the job was told, when the server's
lock expired (the last TTL read before the fault, plus that TTL), when the
second worker took the job, and the overlap (how long the job believed it
held a lock another worker had). ``FAULT_RUNS`` repeats each (``make
faults`` runs several; CI one).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING

import pytest
import redis

import actors
from actors import Timing, lease
from actors.embedded import EmbeddedServer
from tests.faults.conftest import KEYS
from tests.faults.proxy import FaultProxy
from tests.support import default_engine, new_token
from tests.support.sentinel import SentinelSet

if TYPE_CHECKING:
    from collections.abc import Iterator

    from actors import ManagerRef
    from tests.faults.conftest import FaultRecord

RUNS = range(int(os.environ.get("FAULT_RUNS", "1")))
LOCK_MS = 2000
TIMING = Timing(LOCK_MS)
LOCK_KEY = KEYS.key_prefix + "job:lock"

#: The second worker, in its own process: takes the lock the moment it is
#: free and prints the monotonic ms it did.
THIEF = """
import sys, time, redis
client = redis.Redis.from_url(sys.argv[1], socket_timeout=0.2)
print("ready", flush=True)
# Races only once the job's lock exists: before, the job is not anyone's.
while True:
    try:
        if client.exists(sys.argv[2]):
            break
    except redis.RedisError:
        pass
    time.sleep(0.002)
while True:
    try:
        # A SET that timed out in a pause may still run when the server
        # resumes: the lock holding "thief" is taken too.
        if client.set(sys.argv[2], "thief", nx=True, px=60000) or (
            client.get(sys.argv[2]) == b"thief"
        ):
            print(time.monotonic_ns() // 1_000_000, flush=True)
            break
    except redis.RedisError:
        pass
    time.sleep(0.002)
"""


def now_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class Thief:
    """The second worker, in a process of its own (this one may be paused)."""

    def __init__(self, url: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", THIEF, url, LOCK_KEY], stdout=subprocess.PIPE, text=True
        )
        assert self.process.stdout is not None
        assert self.process.stdout.readline().strip() == "ready"

    def took(self, timeout: float) -> int:
        """Monotonic ms at which it took the job."""
        assert self.process.stdout is not None
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise AssertionError("the second worker never took the job") from None
        return int(self.process.stdout.readline())

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


@pytest.fixture
def thief(private_server: EmbeddedServer) -> Iterator[Thief]:
    worker = Thief(private_server.url)
    yield worker
    worker.close()


def take(direct: redis.Redis) -> str:
    token = new_token()
    assert direct.set(LOCK_KEY, token, nx=True, px=LOCK_MS)
    return token


def expiry(direct: redis.Redis) -> int:
    """Monotonic ms at which the server will expire the lock, if nobody renews it."""
    before = now_ms()
    pttl = int(direct.pttl(LOCK_KEY))
    assert pttl > 0
    return before + pttl


class Waiter:
    """A thread beside the job, waiting on the lease: when was it told?"""

    def __init__(self, held: actors.Lease) -> None:
        self.told: int | None = None
        self.thread = threading.Thread(target=self._run, args=(held,), daemon=True)
        self.thread.start()

    def _run(self, held: actors.Lease) -> None:
        if held.wait(timeout=30):
            self.told = now_ms()

    def result(self) -> int:
        self.thread.join(30)
        assert self.told is not None, "the job was never told"
        return self.told


def note(record: FaultRecord, fault: int, told: int, expired: int, taken: int) -> None:
    record.notes = {
        "told_ms": told - fault,
        "expired_ms": expired - fault,
        "taken_ms": taken - fault,
        "ahead_ms": expired - told,
        "overlap_ms": max(0, told - taken),
    }
    record.false_reports = 0


def wait_renewed(manager: ManagerRef) -> None:
    """Return once the manager has renewed the lease's lock (the server confirmed it)."""
    deadline = time.monotonic() + 10
    while actors.get_stats(manager).renewed < 1:
        assert time.monotonic() < deadline, "no renewal"
        time.sleep(0.01)


@contextlib.contextmanager
def leased_job(direct: redis.Redis, connection: str) -> Iterator[tuple[actors.Lease, Waiter]]:
    """Take the job's lock and lease it through a manager on ``connection``.

    Yields the lease, once the manager renewed it, and a thread waiting on it.
    """
    token = take(direct)
    manager = actors.start_link(connection=connection, keys=KEYS, lock_duration=LOCK_MS)
    try:
        with lease(manager, "job", token) as held:
            wait_renewed(manager)
            yield held, Waiter(held)
    finally:
        actors.stop(manager)


@pytest.mark.parametrize("run", RUNS)
def test_partition_the_job_is_told_before_the_server_expires_the_lock(
    run: int, proxy: FaultProxy, direct: redis.Redis, thief: Thief, record: FaultRecord
) -> None:
    # Given a leased job whose manager reaches the server through a proxy
    record.fault = "worker-only partition (black hole)"
    record.asserted = "told before the server expires the lock; overlap 0"
    with leased_job(direct, proxy.url) as (held, watch):
        try:
            # When only the manager's connection is black-holed
            proxy.mode = "blackhole"
            fault = now_ms()
            expired = expiry(direct)
            taken = thief.took(timeout=LOCK_MS / 1000 + 5)
            told = watch.result()
            proxy.passthrough()
            assert held.reason == "unconfirmed"
        finally:
            proxy.passthrough()
    # Then the job heard before the lock could go, and before anyone took it
    note(record, fault, told, expired, taken)
    assert told < expired
    assert told < taken


@pytest.mark.parametrize("run", RUNS)
def test_redis_paused_the_job_is_told_before_the_server_expires_the_lock(
    run: int,
    private_server: EmbeddedServer,
    direct: redis.Redis,
    thief: Thief,
    record: FaultRecord,
) -> None:
    record.fault = "Redis paused (SIGSTOP) past the TTL"
    record.asserted = "told before the server expires the lock; overlap 0"
    with leased_job(direct, private_server.url) as (held, watch):
        expired = expiry(direct)
        fault = now_ms()
        private_server.pause()
        try:
            told = watch.result()
            # Paused past the lock's expiry, then resumed.
            time.sleep(max(0, expired + 200 - now_ms()) / 1000)
        finally:
            private_server.resume()
        # Renewals sent during the pause run when the server resumes
        # (their bytes were in its socket buffers): the lock may live
        # one more TTL, never less.
        taken = thief.took(timeout=LOCK_MS / 1000 + 5)
        assert held.reason == "unconfirmed"
    note(record, fault, told, expired, taken)
    assert told < expired
    assert told < taken


@pytest.mark.parametrize("run", RUNS)
def test_redis_restarted_empty_the_job_is_told_within_a_tick(
    run: int,
    private_server: EmbeddedServer,
    direct: redis.Redis,
    thief: Thief,
    record: FaultRecord,
) -> None:
    record.fault = "Redis restarted empty"
    record.asserted = "told within one interval + the command timeout"
    with leased_job(direct, private_server.url) as (held, watch):
        fault = now_ms()
        private_server.restart()
        expired = now_ms()  # the lock went with the data
        taken = thief.took(timeout=10)
        told = watch.result()
        assert held.reason in {"expired", "stolen"}
    note(record, fault, told, expired, taken)
    # One interval, the client's timeout and retry, and a restart's reconnect.
    assert told - expired <= TIMING.interval + 2 * TIMING.interval // 4 + 1000


def replicating(replica: redis.Redis, primary: EmbeddedServer) -> None:
    """Make ``replica`` a replica of ``primary``; return once it holds the job's lock."""
    # The first sync otherwise waits 5 s for other replicas to join it.
    redis.Redis.from_url(primary.url).config_set("repl-diskless-sync-delay", 0)
    replica.execute_command("REPLICAOF", primary.host, str(primary.port))  # type: ignore[no-untyped-call]
    deadline = time.monotonic() + 10
    while not (
        replica.info("replication").get("master_link_status") == "up" and replica.exists(LOCK_KEY)
    ):
        assert time.monotonic() < deadline, "the replica never synced"
        time.sleep(0.01)


@pytest.mark.parametrize("run", RUNS)
@pytest.mark.parametrize("replicas", [0, 1], ids=["primary-only", "replicas=1"])
def test_failover_to_a_replica_that_missed_renewals(
    run: int,
    replicas: int,
    private_server: EmbeddedServer,
    proxy: FaultProxy,
    direct: redis.Redis,
    record: FaultRecord,
) -> None:
    record.fault = "failover to a replica that missed the last renewals" + (
        ", renewals confirmed by the replica (replicas=1)" if replicas else ""
    )
    record.asserted = (
        "told before the replica's copy expires; overlap 0"
        if replicas
        else "told within one interval + the command timeout of the failover"
    )
    second = EmbeddedServer(default_engine()).start()
    replica = redis.Redis.from_url(second.url, socket_timeout=10)
    manager = actors.start_link(
        connection=proxy.url, keys=KEYS, lock_duration=LOCK_MS, replicas=replicas
    )
    thief_on_replica: Thief | None = None
    try:
        token = take(direct)
        replicating(replica, private_server)
        with lease(manager, "job", token) as held:
            wait_renewed(manager)
            watch = Waiter(held)
            # Given a replica cut off from its primary: it keeps the lock as
            # the last replicated renewal left it, while the primary goes on
            # renewing, and another worker takes the job there once that
            # copy expires
            replica.execute_command("REPLICAOF", "NO", "ONE")  # type: ignore[no-untyped-call]
            cut = now_ms()
            expired = cut + int(replica.pttl(LOCK_KEY))
            thief_on_replica = Thief(second.url)
            taken = thief_on_replica.took(timeout=LOCK_MS / 1000 + 5)
            if replicas:
                # With replicas=1 the renewals the primary took go unconfirmed:
                # the job heard before the replica's copy could expire
                told = watch.result()
                assert held.reason == "unconfirmed"
            else:
                assert not held.lost  # the primary's word alone: it still renews
            # When the worker fails over to that replica
            proxy.upstream = (second.host, second.port)
            fault = now_ms()
            proxy.reset()
            proxy.passthrough()
            if not replicas:
                told = watch.result()
                assert held.reason == "stolen"
    finally:
        actors.stop(manager)
        if thief_on_replica is not None:
            thief_on_replica.close()
        replica.close()
        second.stop()
    note(record, fault, told, expired, taken)
    if replicas:
        record.notes["cut_to_told_ms"] = told - cut
        assert told < expired
        assert told < taken
    else:
        # Then the job heard within a tick (the client's timeout and a reconnect) of the failover
        assert told - fault <= TIMING.interval + TIMING.interval // 4 + 1000


#: Longer than a Sentinel row lasts: a sentinel points a replica that
#: replicates through the proxy back at the primary only this long after it saw it.
SENTINEL_FAILOVER_TIMEOUT_MS = 120_000


@pytest.mark.scenario
@pytest.mark.parametrize("run", RUNS)
@pytest.mark.parametrize("replicas", [0, 1], ids=["primary-only", "replicas=1"])
def test_sentinel_failover_to_a_replica_whose_link_was_cut(
    run: int, replicas: int, record: FaultRecord
) -> None:
    record.fault = "Sentinel failover to a replica whose link was cut (fault proxy)" + (
        ", renewals confirmed by the replica (replicas=1)" if replicas else ""
    )
    record.asserted = (
        "told before the new primary's copy expires; overlap 0"
        if replicas
        else "overlap measured (the renewals of the primary alone)"
    )
    thief: Thief | None = None
    with (
        SentinelSet(failover_timeout_ms=SENTINEL_FAILOVER_TIMEOUT_MS) as sentinels,
        FaultProxy(*sentinels.primary()) as link,
    ):
        # Given a replica that replicates through the proxy, and a job leased
        # through a manager on the Sentinel URL
        sentinels.replicate_through((link.host, link.port))
        primary, replica = sentinels.primary(), sentinels.replica()
        direct = sentinels.admin(primary)
        token = new_token()
        with direct.pipeline(transaction=False) as pipe:
            pipe.set(LOCK_KEY, token, nx=True, px=LOCK_MS)
            pipe.execute_command("WAIT", 1, 5000)  # type: ignore[no-untyped-call]
            assert pipe.execute() == [True, 1], "the replica did not take the lock"
        manager = actors.start_link(
            connection=sentinels.url, keys=KEYS, lock_duration=LOCK_MS, replicas=replicas
        )
        try:
            with lease(manager, "job", token) as held:
                wait_renewed(manager)
                watch = Waiter(held)
                # When the replica's link is cut: the primary goes on renewing, and
                # the replica keeps the lock as the last renewal it saw left it
                link.blackhole()
                cut = now_ms()
                expired = cut + int(sentinels.command(replica, "PTTL", LOCK_KEY))
                thief = Thief(f"redis://{replica[0]}:{replica[1]}/0")
                # and the sentinels fail the primary over to that replica, where
                # another worker takes the job once its copy expires
                sentinels.failover()
                fault = now_ms()
                taken = thief.took(timeout=LOCK_MS / 1000 + 10)
                told = watch.result()
                reason = held.reason
        finally:
            actors.stop(manager)
            if thief is not None:
                thief.close()
    note(record, fault, told, expired, taken)
    record.notes["cut_to_told_ms"] = told - cut
    if replicas:
        # Then with replicas=1 the job heard before that copy could expire
        assert reason == "unconfirmed"
        assert told < expired
        assert told < taken
    else:
        # Then on the primary's word alone, it heard only once its renewals
        # reached the new primary, where the other worker held the job
        assert reason == "stolen"


@pytest.mark.parametrize("run", RUNS)
def test_a_gil_holding_call_the_first_check_after_it_raises(
    run: int,
    private_server: EmbeddedServer,
    direct: redis.Redis,
    thief: Thief,
    record: FaultRecord,
) -> None:
    record.fault = "GIL-holding C call in the job, 2.5x the TTL"
    record.asserted = "the first check() after the pause raises; no step after the steal"
    token = take(direct)
    manager = actors.start_link(connection=private_server.url, keys=KEYS, lock_duration=LOCK_MS)
    try:
        with lease(manager, "job", token) as held:
            wait_renewed(manager)
            expired = expiry(direct)
            fault = now_ms()
            # usleep through PyDLL: the GIL is held for the whole call.
            ctypes.PyDLL(None).usleep(int(2.5 * LOCK_MS * 1000))
            with pytest.raises(actors.LockLost) as raised:
                held.check()
            told = now_ms()
            assert raised.value.reason == "unconfirmed"
            # wait() answers at once too.
            assert held.wait(0)
    finally:
        actors.stop(manager)
    taken = thief.took(timeout=5)
    note(record, fault, told, expired, taken)
    record.notes["steps_after_steal"] = 0
    # The job ran no step between the steal and its check: the pause held it.
    assert told - fault >= int(2.5 * LOCK_MS) - 5
    assert told - (fault + int(2.5 * LOCK_MS)) < 50


@pytest.mark.parametrize("run", RUNS)
def test_a_blocked_event_loop_loses_nothing(
    run: int, private_server: EmbeddedServer, direct: redis.Redis, record: FaultRecord
) -> None:
    record.fault = "event loop blocked 2.5x the TTL (async lease)"
    record.asserted = "no loss: the manager's thread renews meanwhile"
    token = take(direct)
    manager = actors.start_link(connection=private_server.url, keys=KEYS, lock_duration=LOCK_MS)

    async def job() -> bool:
        async with lease(manager, "job", token) as held:
            wait_renewed(manager)
            time.sleep(2.5 * LOCK_MS / 1000)  # blocks the loop, not the GIL
            await asyncio.sleep(0)
            return held.lost

    try:
        lost = asyncio.run(job())
    finally:
        actors.stop(manager)
    record.notes = {"lost": lost}
    assert not lost


#: A worker in a process of its own, holding the job through a lease and
#: checking it every millisecond; prints "ready", then when and why it lost.
WORKER = """
import sys, time
import actors
from actors import QueueKeys, lease
manager = actors.start_link(connection=sys.argv[1], keys=QueueKeys("faults"), lock_duration=2000)
with lease(manager, "job", sys.argv[2]) as held:
    while actors.get_stats(manager).renewed < 1:
        time.sleep(0.01)
    print("ready", flush=True)
    while True:
        try:
            held.check()
        except actors.LockLost as lost:
            print(time.monotonic_ns() // 1_000_000, lost.reason, flush=True)
            break
        time.sleep(0.001)
actors.stop(manager)
"""


@pytest.mark.parametrize("run", RUNS)
def test_a_stopped_worker_process_sees_the_loss_at_its_first_check_after(
    run: int,
    private_server: EmbeddedServer,
    direct: redis.Redis,
    thief: Thief,
    record: FaultRecord,
) -> None:
    record.fault = "worker process stopped (SIGSTOP/SIGCONT) 2.5x the TTL"
    record.asserted = "the first check() after SIGCONT raises, within 50 ms"
    token = take(direct)
    worker = subprocess.Popen(
        [sys.executable, "-c", WORKER, private_server.url, token],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert worker.stdout is not None
        assert worker.stdout.readline().strip() == "ready"
        expired = expiry(direct)
        fault = now_ms()
        os.kill(worker.pid, signal.SIGSTOP)
        time.sleep(2.5 * LOCK_MS / 1000)
        resumed = now_ms()
        os.kill(worker.pid, signal.SIGCONT)
        told, reason = worker.stdout.readline().split()
        worker.wait(10)
    finally:
        if worker.poll() is None:
            os.kill(worker.pid, signal.SIGCONT)
            worker.kill()
            worker.wait()
    taken = thief.took(timeout=5)
    note(record, fault, int(told), expired, taken)
    record.notes["after_resume_ms"] = int(told) - resumed
    assert reason == "unconfirmed"
    assert int(told) - resumed < 50
