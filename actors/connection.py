"""Clients, and the one rule that bounds how long a failed command may take.

While a tick waits for Redis the manager answers nobody, so every client it
uses must give up on a dead server well inside one tick interval. redis-py's
defaults do not: a failed command is retried up to ten times with backoff,
and a cluster client refreshes its topology and sleeps on each CLUSTERDOWN.

The rule, used by every client built here, by the start-up warning about a
client passed in, and by ``python -m actors explain``: a failed tick (two
attempts) holds the manager for at most half an interval, so each attempt
waits at most :func:`command_timeout` seconds.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import redis
from redis.backoff import NoBackoff
from redis.crc import key_slot
from redis.retry import Retry

if TYPE_CHECKING:
    from actors.keys import QueueKeys

__all__ = [
    "RETRIES",
    "Client",
    "check_client",
    "check_cluster_keys",
    "client_for_url",
    "cluster_client",
    "command_timeout",
    "hash_slot",
    "is_cluster",
    "socket_timeout",
]

logger = logging.getLogger(__name__)

#: A client the manager accepts: one server or a cluster.
Client = redis.Redis | redis.RedisCluster

#: Retries after a failed attempt. One, at once, absorbs a stale pooled
#: connection after a server restart or failover; more would stretch a tick.
RETRIES = 1

#: Shortest and longest wait per attempt, in seconds.
_FLOOR, _CEILING = 0.05, 5.0


def command_timeout(interval_ms: int, *, cluster: bool = False) -> float:
    """Return the longest wait per attempt, in seconds, for a tick ``interval_ms`` long.

    A quarter of the interval on one server: two attempts fill half of it.
    A tenth on a cluster, where an attempt may also wait for a topology
    refresh and for redis-py's fixed 0.25 s pause on CLUSTERDOWN. Never
    below 50 ms (a round trip must fit) nor above 5 s.
    """
    share = 10 if cluster else 4
    return min(max(interval_ms / 1000 / share, _FLOOR), _CEILING)


def client_for_url(
    url: str, *, interval_ms: int | None = None, timeout: float | None = None
) -> redis.Redis:
    """Build a one-server client whose failed command returns in bounded time.

    Args:
        url: A ``redis://``, ``rediss://`` or ``unix://`` URL.
        interval_ms: The manager's tick interval; the timeout is then
            :func:`command_timeout` of it.
        timeout: The wait per attempt in seconds, when no interval is given.

    Raises:
        ValueError: ``url`` is not a Redis URL.
    """
    seconds = command_timeout(interval_ms) if interval_ms is not None else timeout
    return redis.Redis.from_url(
        url,
        socket_timeout=seconds,
        socket_connect_timeout=seconds,
        retry=Retry(NoBackoff(), RETRIES),
    )


def cluster_client(url: str, *, interval_ms: int, **options: Any) -> redis.RedisCluster:
    """Build a cluster client whose failed command returns within one tick interval.

    Example:
        >>> conn = cluster_client("redis://10.0.0.5:7000", interval_ms=7500)
        >>> manager = start_link(connection=conn, keys=QueueKeys("{myqueue}"))

    Args:
        url: ``redis://host:port`` of any node; the client finds the others.
        interval_ms: The manager's tick interval (``lock_renew_time // 2``).
        **options: More ``redis.RedisCluster`` options; they override the
            timeouts and retries chosen here.
    """
    seconds = command_timeout(interval_ms, cluster=True)
    options.setdefault("socket_timeout", seconds)
    options.setdefault("socket_connect_timeout", seconds)
    options.setdefault("retry", Retry(NoBackoff(), RETRIES))
    return redis.RedisCluster.from_url(url, **options)


def is_cluster(conn: object) -> bool:
    """Whether ``conn`` is a ``redis.RedisCluster`` client."""
    return isinstance(conn, redis.RedisCluster)


def _connection_kwargs(conn: object) -> dict[str, Any]:
    # A one-server client keeps them on its pool, a cluster client on its nodes manager.
    pool = getattr(conn, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", None)
    if kwargs is None:
        nodes = getattr(conn, "nodes_manager", None)
        kwargs = getattr(nodes, "connection_kwargs", None) or {}
    return dict(kwargs)


def socket_timeout(conn: object) -> float | None:
    """Return the socket timeout a client was built with, in seconds, or ``None``."""
    value = _connection_kwargs(conn).get("socket_timeout")
    return float(value) if value is not None else None


def encoding(conn: object) -> str:
    """Return the encoding a client uses for keys and arguments (``"utf-8"`` by default)."""
    return str(_connection_kwargs(conn).get("encoding", "utf-8"))


def check_client(conn: object, keys: QueueKeys, interval_ms: int) -> None:
    """Check a client given to a manager; warn when it can hold a tick too long.

    Raises:
        TypeError: ``conn`` is not a ``redis.Redis`` or ``redis.RedisCluster``.
        ValueError: The client's encoding is not UTF-8 (lock keys, tokens and
            the script's arguments are UTF-8 on every runtime), or the queue's
            keys cannot share one slot of the cluster it talks to.
    """
    if not isinstance(conn, (redis.Redis, redis.RedisCluster)):
        raise TypeError(
            "connection must be a redis.Redis, a redis.RedisCluster or a URL, "
            f"got {type(conn).__name__}"
        )
    name = encoding(conn)
    if name.replace("_", "-").lower() not in ("utf-8", "utf8"):
        raise ValueError(
            f"connection encodes with {name!r}; lock keys and tokens are UTF-8 on every "
            "runtime, so ids would not round-trip: build the client with encoding='utf-8'"
        )
    cluster = is_cluster(conn)
    if cluster:
        check_cluster_keys(keys)
    limit = command_timeout(interval_ms, cluster=cluster)
    given = socket_timeout(conn)
    if given is not None and given <= limit:
        return
    if cluster:
        fix = f"build it with actors.connection.cluster_client(url, interval_ms={interval_ms})"
    else:
        fix = f"pass socket_timeout={limit:g} (or less), or pass a URL"
    what = "no socket_timeout" if given is None else f"socket_timeout={given:g} s"
    logger.warning(
        "LockManager for queue %r: the client has %s, but a failed tick must end within "
        "half the %d ms interval (%g s per attempt), or a hung server holds every query "
        "to the manager; %s",
        keys.name,
        what,
        interval_ms,
        limit,
        fix,
    )


def hash_slot(key: str) -> int:
    """Return the Redis Cluster hash slot (0-16383) of ``key``."""
    return int(key_slot(key.encode("utf-8")))


def check_cluster_keys(keys: QueueKeys) -> None:
    """Check that all of a queue's keys share one Redis Cluster hash slot.

    The renewal script touches lock keys it does not declare in KEYS, which a
    cluster only allows when they hash to the slot of its one declared key.

    Raises:
        ValueError: The queue name and prefix carry no hash tag.
    """
    if keys.hash_tag is None:
        raise ValueError(
            f"queue keys {keys.base!r} do not share one hash slot, so the renewal script "
            f"cannot run on a Redis Cluster: put a hash tag in the queue name or the prefix, "
            f"as in QueueKeys('{{{keys.name}}}', prefix={keys.prefix!r}), which gives "
            f"'{keys.prefix}:{{{keys.name}}}:<job_id>:lock' (the same rule as BullMQ's "
            f"'{{queue}}' names)"
        )
