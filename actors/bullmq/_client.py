"""The client a bullmq worker's locks are renewed with: given, or built from the worker's."""

from __future__ import annotations

from typing import Any

import redis
import redis.asyncio

from actors.connection import client_for_url, client_like
from actors.schedule import Timing

__all__ = ["renewal_client"]


def renewal_client(
    worker: Any,
    connection: redis.Redis | redis.RedisCluster | str | None,
    lock_duration: int,
    lock_renew_time: int,
) -> tuple[redis.Redis | redis.RedisCluster, bool]:
    """Return the client to renew the worker's locks with, and whether it was built here.

    A client built here (from a URL, or from the worker's ``connection``
    option) has timeouts that keep a failed tick well under one interval;
    the caller closes it.

    Raises:
        TypeError: A duration is not an ``int``, or the connection cannot be used.
        ValueError: The durations cannot make a schedule.
    """
    try:
        timing = Timing(lock_duration, lock_renew_time)
    except (TypeError, ValueError) as error:
        raise type(error)(
            f"worker options lockDuration={lock_duration!r}, "
            f"lockRenewTime={lock_renew_time!r}: {error}"
        ) from error
    if connection is None:
        options = worker.opts.get("connection", {})
        if isinstance(options, (redis.asyncio.RedisCluster, redis.RedisCluster)):
            raise TypeError(
                "the worker talks to a Redis Cluster: pass the renewal client yourself, "
                "use_actor_lock_manager(worker, connection=actors.connection."
                f"cluster_client(url, interval_ms={timing.interval}))"
            )
        return client_like(options, interval_ms=timing.interval), True
    if isinstance(connection, str):
        return client_for_url(connection, interval_ms=timing.interval), True
    if not isinstance(connection, (redis.Redis, redis.RedisCluster)):
        raise TypeError(
            "connection must be a redis.Redis, a redis.RedisCluster or a URL, "
            f"got {type(connection).__name__}"
        )
    return connection, False
