"""The bullmq integration's connections and runs, on a real server."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import redis
import redis.asyncio
from bullmq import Worker

from actors import QueueKeys, aio
from actors.bullmq import use_actor_lock_manager
from tests.support import TTL

if TYPE_CHECKING:
    from tests.conftest import Server

KEYS = QueueKeys("bullmq-connection")


def test_a_dict_connection_with_a_pool_renews_on_the_pools_server(server: Server) -> None:
    """A worker connection ``{"connection_pool": pool}`` is renewed on the pool's server.

    bullmq-py passes a dict's keywords to ``redis.asyncio.Redis``, which takes
    host and port from ``connection_pool``; the renewal client reads the same
    settings from the pool.
    """
    parts = urlsplit(server.url)
    host, port = parts.hostname, parts.port

    async def scenario() -> dict[str, Any] | None:
        pool = redis.asyncio.ConnectionPool(host=host, port=port, db=2)
        worker = Worker(
            "redelivered",
            None,
            {"connection": {"connection_pool": pool}, "autorun": False, "lockDuration": 2000},
        )
        try:
            try:
                installed = use_actor_lock_manager(worker)
            except (TypeError, ValueError):
                return None  # refused at install: the user learns it at once
            conn = installed.connection
            assert isinstance(conn, redis.Redis)
            return dict(conn.connection_pool.connection_kwargs)
        finally:
            await worker.close()
            await pool.aclose()

    kwargs = asyncio.run(scenario())
    if kwargs is None:
        return
    assert (kwargs.get("host"), kwargs.get("port"), kwargs.get("db")) == (host, port, 2)


def test_the_old_run_of_a_redelivered_job_leaves_the_new_runs_lock_tracked(server: Server) -> None:
    """An old run releases its own token: the lock its re-run holds stays tracked.

    A stalled job handed back to the same worker runs again with a new token
    while its first run goes on (``concurrency > 1``). When the first run's
    processor returns, only that run's lock is untracked; the new run's lock is
    still renewed.
    """

    class Job:
        def __init__(self, job_id: str) -> None:
            self.id = job_id

    async def process(job: Any, token: str) -> None:
        return None

    async def scenario() -> bool:
        worker = Worker(
            "redelivered",
            process,
            {"connection": server.url, "autorun": False, "lockDuration": TTL},
        )
        try:
            installed = use_actor_lock_manager(worker)
            installed.start()
            now = time.time_ns() // 1_000_000
            installed.track_job("1", "first-token", now)
            # Taken again, with a new token, while the first run still runs.
            installed.track_job("1", "second-token", now)
            # The first run's processor returns.
            await worker.processor(Job("1"), "first-token")
            manager = installed.manager
            assert manager is not None
            return await aio.is_tracked(manager, "1")
        finally:
            await worker.close()

    assert asyncio.run(scenario()), "the re-run's lock was untracked by the first run"
