"""Say which server a client or URL reaches, with its password masked.

For log lines and errors: where a manager looked for its server, and what to
check when it cannot reach it.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import redis
import redis.asyncio

__all__ = ["connection_kwargs", "describe_connection", "redacted_url", "unreachable_message"]


def connection_kwargs(conn: object) -> dict[str, Any]:
    """Return the keywords a client's connections are built with.

    A one-server client keeps them on its pool, a cluster client on its nodes manager.
    """
    pool = getattr(conn, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", None)
    if kwargs is None:
        nodes = getattr(conn, "nodes_manager", None)
        kwargs = getattr(nodes, "connection_kwargs", None) or {}
    return dict(kwargs)


def redacted_url(url: str) -> str:
    """Return ``url`` with its password, if any, replaced by ``***``."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return "<a URL that does not parse>"
    if password is None:
        return url
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}"))


def describe_connection(conn: object) -> str:
    """Return the server a client or URL reaches, as a URL with the password masked.

    For log lines and errors: ``rediss://user:***@host:6380/2``,
    ``unix:///run/redis.sock?db=0``, or the first startup node of a cluster
    client. A client whose pool does not name its server (a Sentinel-managed
    one) is described by its type.
    """
    if isinstance(conn, str):
        return redacted_url(conn)
    if isinstance(conn, (redis.RedisCluster, redis.asyncio.RedisCluster)):
        nodes = getattr(conn, "startup_nodes", None) or getattr(
            getattr(conn, "nodes_manager", None), "startup_nodes", None
        )
        first = next(iter(nodes.values() if isinstance(nodes, dict) else nodes or []), None)
        kwargs = connection_kwargs(conn)
        where = f"{first.host}:{first.port}" if first is not None else "?"
        return f"{_scheme_auth('redis', kwargs)}{where} (cluster)"
    pool = getattr(conn, "connection_pool", None)
    kwargs = dict(getattr(pool, "connection_kwargs", None) or {})
    kind = getattr(pool, "connection_class", None)
    db = kwargs.get("db", 0)
    if kwargs.get("path"):
        user = kwargs.get("username")
        password = "" if kwargs.get("password") is None else "&password=***"
        auth = f"{quote(user)}@" if user else ""
        return f"unix://{auth}{quote(str(kwargs['path']))}?db={db}{password}"
    if kwargs.get("host"):
        ssl = kind in (redis.SSLConnection, redis.asyncio.SSLConnection)
        scheme = "rediss" if ssl else "redis"
        return f"{_scheme_auth(scheme, kwargs)}{kwargs['host']}:{kwargs.get('port', 6379)}/{db}"
    return f"a {type(conn).__module__}.{type(conn).__qualname__} client"


def _scheme_auth(scheme: str, kwargs: dict[str, Any]) -> str:
    user = kwargs.get("username") or ""
    if kwargs.get("password") is not None:
        return f"{scheme}://{quote(user)}:***@"
    if user:
        return f"{scheme}://{quote(user)}@"
    return f"{scheme}://"


def unreachable_message(conn: object, queue: str, exc: BaseException) -> str:
    """Say that a manager cannot reach its server, where it looked, and what to check.

    Args:
        conn: The manager's client (or URL).
        queue: The queue's name.
        exc: The connection error or timeout.
    """
    where = describe_connection(conn)
    cause = " ".join(f"{type(exc).__name__}: {exc}".split())
    if isinstance(exc, redis.AuthenticationError):
        check = "the username and password"
    else:
        check = (
            "that the server runs and listens there, that host, port and database are "
            "right (unix:// for a socket, rediss:// for TLS), and that no firewall is in the way"
        )
    return (
        f"LockManager for queue {queue!r} cannot reach its Redis server at {where} "
        f"({cause}); check {check}. Its locks are not renewed until it can: every tick "
        f"tries again"
    )
