"""Installing the manager: the interface bullmq's Worker uses, the client it builds, bad input."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import bullmq
import pytest
import redis
import redis.asyncio
from bullmq import Worker

from actors import Timing
from actors.bullmq import ActorLockManager, use_actor_lock_manager
from actors.connection import command_timeout, socket_timeout
from tests.bullmq.harness import PREFIX

if TYPE_CHECKING:
    from tests.conftest import Server

#: BullMQ's ``lockDuration``, in milliseconds; the tick interval is a quarter.
LOCK_MS = 2000
#: Longest wait for a renewal, in seconds.
SETTLE_S = 5.0


def worker_for(connection: object, **opts: Any) -> Any:
    """A bullmq Worker that does not run; create it inside a running loop."""
    options = {"connection": connection, "prefix": PREFIX, "autorun": False, **opts}
    return Worker("install", None, options)


def test_it_has_every_public_method_of_bullmqs_lock_manager() -> None:
    stock = {name for name in dir(bullmq.LockManager) if not name.startswith("_")}
    assert stock <= set(dir(ActorLockManager))


@pytest.mark.parametrize("kind", ["url", "dict", "asyncio_client"])
def test_the_renewal_client_comes_from_the_workers_connection(
    server: Server, redis_client: redis.Redis, kind: str
) -> None:
    # Given a worker whose connection (database 1) is a URL, options, or a client,
    parts = urlsplit(server.url)
    host, port = parts.hostname, parts.port
    assert host is not None and port is not None

    async def scenario() -> tuple[float | None, int, bool]:
        options: Any = {
            "url": f"redis://{host}:{port}/1",
            "dict": {"host": host, "port": port, "db": 1},
            "asyncio_client": redis.asyncio.Redis(host=host, port=port, db=1),
        }[kind]
        worker = worker_for(options, lockDuration=LOCK_MS)
        installed = use_actor_lock_manager(worker)
        conn = installed.connection
        assert isinstance(conn, redis.Redis)
        # the client renews in database 1 of the same server,
        lock_key = installed.keys.lock("1")
        assert lock_key == f"{PREFIX}:install:1:lock"
        other = redis.Redis(host=host, port=port, db=1, socket_timeout=10)
        other.set(lock_key, "token", px=LOCK_MS)
        installed.start()
        installed.track_job("1", "token", time.time_ns() // 1_000_000)
        # (a renewal shows as the lock's TTL going up),
        deadline = time.monotonic() + SETTLE_S
        lowest = LOCK_MS
        while (ttl := int(other.pttl(lock_key))) <= lowest:
            assert time.monotonic() < deadline, "the lock was not renewed"
            lowest = ttl
            await asyncio.sleep(0.01)
        renewed = bool(other.exists(lock_key)) and not redis_client.exists(lock_key)
        await worker.close()
        other.close()
        if kind == "asyncio_client":
            await options.aclose()
        return socket_timeout(conn), conn.connection_pool.connection_kwargs["db"], renewed

    timeout, db, renewed = asyncio.run(scenario())

    # with the timeout the trust window allows.
    assert timeout == command_timeout(Timing(LOCK_MS))
    assert db == 1
    assert renewed


def test_a_client_given_is_used_and_left_open(server: Server) -> None:
    given = redis.Redis.from_url(server.url, socket_timeout=0.1)

    async def scenario() -> ActorLockManager:
        worker = worker_for(server.url, lockDuration=LOCK_MS)
        installed = use_actor_lock_manager(worker, connection=given)
        installed.start()
        await worker.close()
        return installed

    installed = asyncio.run(scenario())
    assert installed.connection is given
    assert given.ping()
    given.close()


def test_renewal_is_off_when_lock_renew_time_is_zero(server: Server) -> None:
    async def scenario() -> None:
        worker = worker_for(server.url, lockDuration=LOCK_MS, lockRenewTime=0)
        installed = use_actor_lock_manager(worker)
        installed.start()
        # As in bullmq-py: nothing renews, jobs are still tracked and cancellable.
        assert not installed.renews and installed.connection is None
        assert not installed.is_running()
        controller = installed.track_job("1", "token", time.time_ns() // 1_000_000, True)
        assert controller is not None
        assert installed.get_tracked_job_ids() == ["1"]
        assert installed.tracked_jobs["1"]["abort_controller"] is controller
        assert installed.cancel_job("1", "why")
        assert controller.signal.reason == "why"
        installed.untrack_job("1")
        assert installed.get_active_job_count() == 0
        await worker.close()

    asyncio.run(scenario())


def test_installing_twice_returns_the_first(server: Server) -> None:
    async def scenario() -> None:
        worker = worker_for(server.url)
        first = use_actor_lock_manager(worker)
        assert use_actor_lock_manager(worker) is first
        assert worker.lockManager is first
        await worker.close()

    asyncio.run(scenario())


def test_a_running_worker_is_refused(server: Server) -> None:
    async def scenario() -> None:
        worker = worker_for(server.url, drainDelay=1)
        task = asyncio.ensure_future(worker.run())
        while not worker.running:
            await asyncio.sleep(0.001)
        with pytest.raises(RuntimeError, match=r'before the worker runs.*"autorun": False'):
            use_actor_lock_manager(worker)
        await worker.close()
        await task

    asyncio.run(scenario())


def test_a_closed_worker_is_refused_saying_how_to_install(server: Server) -> None:
    async def scenario() -> None:
        worker = worker_for(server.url)
        await worker.close()
        with pytest.raises(RuntimeError, match='"autorun": False'):
            use_actor_lock_manager(worker)

    asyncio.run(scenario())


def test_an_autorun_worker_installed_right_after_creation_is_renewed(server: Server) -> None:
    # bullmq's default autorun schedules run() for the loop's next turn.
    async def scenario() -> None:
        async def process(job: Any, token: str) -> None:
            return None

        options = {"connection": server.url, "prefix": PREFIX, "drainDelay": 1}
        worker = Worker("install", process, options)
        installed = use_actor_lock_manager(worker)
        deadline = time.monotonic() + SETTLE_S
        while not worker.running:
            assert time.monotonic() < deadline, "the worker did not start"
            await asyncio.sleep(0.001)
        assert installed.is_running()
        await worker.close()

    asyncio.run(scenario())


@pytest.mark.parametrize("name", ["", "a:b"])
def test_every_queue_name_bullmq_runs_is_renewed(server: Server, name: str) -> None:
    # bullmq-py runs a queue of any name, and keys it '{prefix}:{name}:...'.
    client = server.client()

    async def scenario() -> list[str]:
        renewed: list[str] = []
        worker = worker_for(server.url, lockDuration=LOCK_MS)
        worker.name = name
        installed = use_actor_lock_manager(worker)
        worker.on("locksRenewed", lambda event: renewed.extend(event["jobIds"]))
        installed.start()
        client.set(f"{PREFIX}:{name}:7:lock", "token", px=LOCK_MS)
        installed.track_job("7", "token", time.time_ns() // 1_000_000)
        deadline = time.monotonic() + SETTLE_S
        while not renewed and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        await worker.close()
        return renewed

    try:
        assert asyncio.run(scenario()) == ["7"]
    finally:
        client.delete(f"{PREFIX}:{name}:7:lock")
        client.close()


@pytest.mark.parametrize(
    ("opts", "error", "match"),
    [
        ({"lockDuration": 1000, "lockRenewTime": 1000}, ValueError, "lockRenewTime=1000"),
        ({"lockDuration": 1000.0}, TypeError, "lockDuration=1000.0"),
        ({"lockDuration": "1000", "lockRenewTime": 500}, TypeError, "lockDuration='1000'"),
    ],
)
def test_durations_that_make_no_schedule_are_refused(
    server: Server, opts: dict[str, Any], error: type[Exception], match: str
) -> None:
    async def scenario() -> None:
        worker = worker_for(server.url, **opts)
        with pytest.raises(error, match=match):
            use_actor_lock_manager(worker)
        await worker.close()

    asyncio.run(scenario())


def test_a_cluster_connection_asks_for_a_client(server: Server) -> None:
    async def scenario() -> None:
        cluster = redis.asyncio.RedisCluster(host="127.0.0.1", port=1)
        worker = worker_for(cluster)
        with pytest.raises(TypeError, match="cluster_client"):
            use_actor_lock_manager(worker)

    asyncio.run(scenario())


def test_what_is_not_a_worker_is_refused() -> None:
    with pytest.raises(TypeError, match="bullmq Worker"):
        use_actor_lock_manager(object())
