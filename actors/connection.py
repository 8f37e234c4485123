"""Clients: which server one reaches, and the rule that bounds how long a failed command takes.

Each renewal must end, or the locks wait behind it, and redis-py's defaults
(ten retries with backoff) do not. The rule, :func:`command_timeout`, bounds
every client built here, the warning about a client passed in, and ``python
-m actors explain``.
"""

from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import quote, unquote, urlsplit, urlunsplit

import redis
import redis.asyncio
import redis.sentinel
from redis.asyncio.sentinel import SentinelConnectionPool as SentinelPoolAsync
from redis.backoff import NoBackoff
from redis.retry import Retry

from actors.keys import check_cluster_keys
from actors.timing import Timing, default_safety_margin

if TYPE_CHECKING:
    from actors.keys import QueueKeys

__all__ = [
    "RETRIES",
    "SENTINEL_SCHEMES",
    "Client",
    "SentinelURL",
    "check_client",
    "client_for_url",
    "client_like",
    "client_settings",
    "cluster_client",
    "command_timeout",
    "connection_kwargs",
    "describe_connection",
    "encoding",
    "is_cluster",
    "parse_sentinel_url",
    "redacted_url",
    "socket_timeout",
    "unreachable_message",
]

logger = logging.getLogger(__name__)

#: A client the manager accepts: one server or a cluster.
Client = redis.Redis | redis.RedisCluster

#: Retries after a failed attempt. One, at once, absorbs a stale pooled
#: connection after a server restart or failover; more would stretch a tick.
RETRIES = 1

#: Shortest and longest wait per attempt, in seconds.
_FLOOR, _CEILING = 0.05, 5.0


def command_timeout(
    timing: Timing, safety_margin: int | None = None, *, cluster: bool = False
) -> float:
    """Return the longest wait per attempt, in seconds, of a manager with these windows.

    A watched lock is trusted for ``lock_duration - safety_margin`` (ms;
    the default margin when ``None``) after a confirmed send, so a renewal
    answered later than that minus one interval is of no use: two attempts
    share what is left (a quarter each on a cluster, for topology refreshes
    and CLUSTERDOWN pauses). Between 50 ms and 5 s; with the default windows,
    1.25 intervals on one server.
    """
    margin = default_safety_margin(timing) if safety_margin is None else safety_margin
    useful = timing.lock_duration - margin - timing.interval
    share = 4 if cluster else 2
    return min(max(useful / 1000 / share, _FLOOR), _CEILING)


#: No CLIENT SETINFO on connect: two round trips before a new connection's
#: first renewal, each as long as the link's latency (redis-py 8 spells it
#: ``driver_info=None``, 5-7 ``lib_name=None``).
_NO_SETINFO: Final[dict[str, Any]] = (
    {"driver_info": None}
    if "driver_info" in inspect.signature(redis.Redis.__init__).parameters
    else {"lib_name": None, "lib_version": None}
)


def client_for_url(url: str, *, timeout: float) -> redis.Redis:
    """Build a one-server client from a URL, waiting ``timeout`` seconds per attempt.

    ``redis://``, ``rediss://`` and ``unix://`` as redis-py reads them, or a
    Sentinel-managed primary (see :func:`parse_sentinel_url`): the client then
    asks the sentinels where the primary is at each connect, so it follows a
    failover.

    Raises:
        ValueError: ``url`` is not a Redis URL.
    """
    bounded: dict[str, Any] = {
        "socket_timeout": timeout,
        "socket_connect_timeout": timeout,
        "retry": Retry(NoBackoff(), RETRIES),
        **_NO_SETINFO,
    }
    sentinel = parse_sentinel_url(url)
    if sentinel is None:
        return redis.Redis.from_url(url, **bounded)
    found = {"sentinels": sentinel.sentinels, "service": sentinel.service, "ssl": sentinel.ssl}
    auth = {"username": sentinel.username, "password": sentinel.password}
    return _sentinel_client(found, timeout, db=sentinel.db, **auth, **bounded)


#: Schemes of a URL that names a Sentinel-managed primary (``rediss+`` for TLS to it).
SENTINEL_SCHEMES: Final = ("redis+sentinel", "rediss+sentinel")


@dataclass(frozen=True)
class SentinelURL:
    """What a ``redis+sentinel://`` URL names."""

    #: Each sentinel's ``(host, port)``.
    sentinels: list[tuple[str, int]]
    #: The name the sentinels know the primary by (``sentinel monitor <name> ...``).
    service: str
    db: int
    username: str | None
    password: str | None
    #: TLS to the primary.
    ssl: bool


def parse_sentinel_url(url: str) -> SentinelURL | None:
    """Read ``redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/service[/db]``.

    Ports default to 26379; the credentials are the primary's (the sentinels
    are reached without). ``None`` when ``url`` has another scheme.

    Example:
        >>> parse_sentinel_url("redis+sentinel://:pw@10.0.0.1,10.0.0.2:26380/mymaster/2").service
        'mymaster'

    Raises:
        ValueError: A Sentinel URL with no sentinel, no service name, a bad
            port or database number.
    """
    parts = _sentinel_parts(url)
    if parts is None:
        return None
    scheme, userinfo, hosts, path = parts
    username = password = None
    if userinfo is not None:
        user, colon, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon else None
    # No value of the URL is quoted back in these errors: it may hold a password.
    sentinels = []
    for item in filter(None, hosts.split(",")):
        if item.startswith("["):  # [IPv6]:port
            host, _, after = item[1:].partition("]")
            port = after.removeprefix(":")
        else:
            host, _, port = item.partition(":")
        if not host:
            raise ValueError("a Sentinel URL names each sentinel's host: host[:port],...")
        if port and not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
            raise ValueError("a Sentinel URL's ports are numbers from 1 to 65535")
        sentinels.append((host, int(port) if port else 26379))
    if not sentinels:
        raise ValueError(
            "a Sentinel URL names at least one sentinel: redis+sentinel://host:26379/name"
        )
    if "?" in path or "#" in path:
        raise ValueError(
            "a Sentinel URL takes no query or fragment: redis+sentinel://host:26379/service/db"
        )
    service, _, db = path.partition("/")
    if not service:
        raise ValueError(
            "a Sentinel URL names the primary's service: redis+sentinel://host:26379/mymaster"
        )
    db = db.strip("/")
    if db and not (db.isascii() and db.isdigit()):
        raise ValueError("a Sentinel URL's database is a number: /service/db")
    return SentinelURL(
        sentinels, unquote(service), int(db or 0), username, password, scheme == "rediss+sentinel"
    )


def _sentinel_parts(url: str) -> tuple[str, str | None, str, str] | None:
    """Split a Sentinel URL: scheme (lower case), user info, hosts, path; ``None`` if not one.

    The user info ends at the last ``@`` before the first ``/``: a password
    may hold ``#``, ``?`` or ``@`` (``%40``), none of which ends it here.
    """
    scheme, found, rest = url.partition("://")
    if not found or scheme.lower() not in SENTINEL_SCHEMES:
        return None
    netloc, _, path = rest.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    return scheme.lower(), userinfo if at else None, hosts, path


#: Settings of given options that a client built here sets itself: bounded
#: timeouts and retries (so a tick cannot hang), no client name (BullMQ lists
#: a queue's workers by client name; a renewal client is not one), and
#: redis-py's default replies (the manager reads ids either way).
_OWN_SETTINGS = frozenset(
    {
        "socket_timeout",
        "socket_connect_timeout",
        "retry",
        "retry_on_error",
        "retry_on_timeout",
        "single_connection_client",
        "client_name",
        "decode_responses",
        "connection_pool",
        "lib_name",
        "lib_version",
        "driver_info",
    }
)

#: Settings read from another client's pool, besides ``ssl_*``.
_COPIED_SETTINGS = (
    "host",
    "port",
    "db",
    "username",
    "password",
    "credential_provider",
    "encoding",
    "encoding_errors",
)


def client_like(
    options: object, *, timeout: float, bounded: bool = True, retries: int = RETRIES
) -> redis.Redis:
    """Build a bounded one-server client that reaches the server ``options`` reach.

    ``options`` is a URL, a dict of ``redis.Redis`` keywords (or one holding a
    ``connection_pool``), or a ``redis.Redis`` / ``redis.asyncio.Redis`` whose
    server, database, credentials and TLS settings are copied. ``timeout`` is
    the wait per attempt in seconds, for replies too when ``bounded``.

    Raises:
        TypeError: ``options`` is a cluster client, a client or pool that does
            not name its server (a Sentinel-managed one), or none of the above.
    """
    if isinstance(options, str):
        return client_for_url(options, timeout=timeout)
    if isinstance(options, dict) and options.get("connection_pool") is not None:
        settings = _settings_of(options["connection_pool"])
    elif isinstance(options, dict):
        settings = {key: value for key, value in options.items() if key not in _OWN_SETTINGS}
    elif isinstance(options, (redis.Redis, redis.asyncio.Redis)):
        settings = _settings_of(options.connection_pool)
    elif isinstance(options, (redis.asyncio.RedisCluster, redis.RedisCluster)):
        raise TypeError(
            "a Redis Cluster client cannot be copied into a one-server client: use "
            "actors.connection.cluster_client(url, interval_ms=...) with the manager's interval"
        )
    else:
        raise TypeError(
            "connection options must be a URL, a dict of redis.Redis keywords or a "
            f"redis.Redis / redis.asyncio.Redis client, got {type(options).__name__}"
        )
    bounds: dict[str, Any] = {
        "socket_timeout": timeout if bounded else None,
        "socket_connect_timeout": timeout,
        "retry": Retry(NoBackoff(), retries),
        **_NO_SETINFO,
    }
    sentinel = settings.pop("sentinel", None)
    if sentinel is not None:
        return _sentinel_client(sentinel, timeout, **settings, **bounds)
    return redis.Redis(**settings, **bounds)


#: Connection classes whose pool's keywords name the server: redis-py's plain
#: ones. Any other (Sentinel, a subclass) finds its server some other way.
_PLAIN_CONNECTIONS: tuple[type, ...] = (
    redis.Connection,
    redis.SSLConnection,
    redis.UnixDomainSocketConnection,
    redis.asyncio.Connection,
    redis.asyncio.SSLConnection,
    redis.asyncio.UnixDomainSocketConnection,
)


def _settings_of(pool: Any) -> dict[str, Any]:
    sentinel = _sentinel_settings(pool)
    if sentinel is not None:
        return sentinel
    # A pool that does not name its server, copied, would reach localhost:6379.
    given = pool.connection_kwargs
    kind = pool.connection_class
    if kind not in _PLAIN_CONNECTIONS or not (given.get("host") or given.get("path")):
        raise TypeError(
            f"cannot tell which server a pool of {kind.__module__}.{kind.__qualname__} "
            "connections reaches (a Sentinel-managed client, or a pool with no host and no "
            "socket path): pass the renewal client explicitly, "
            "use_actor_lock_manager(worker, connection=...) with a redis.Redis or a URL "
            "(redis+sentinel://host:26379/service for a Sentinel-managed primary)"
        )
    settings = {key: given[key] for key in _COPIED_SETTINGS if key in given}
    if kind in (redis.UnixDomainSocketConnection, redis.asyncio.UnixDomainSocketConnection):
        settings.pop("host", None)
        settings.pop("port", None)
        settings["unix_socket_path"] = given["path"]
    elif kind in (redis.SSLConnection, redis.asyncio.SSLConnection):
        settings["ssl"] = True
        settings.update(_tls_of(given))
    return settings


def _tls_of(given: dict[str, Any]) -> dict[str, Any]:
    """The ``ssl_*`` keywords of ``given`` that this redis-py's ``Redis()`` takes."""
    accepted = inspect.signature(redis.Redis.__init__).parameters
    return {
        key: value for key, value in given.items() if key.startswith("ssl_") and key in accepted
    }


def _sentinel_settings(pool: Any) -> dict[str, Any] | None:
    """A Sentinel-managed pool's settings: its sentinels and service under ``"sentinel"``."""
    if not isinstance(pool, (redis.sentinel.SentinelConnectionPool, SentinelPoolAsync)):
        return None
    given = pool.connection_kwargs
    settings = {key: given[key] for key in _COPIED_SETTINGS if key in given}
    settings.pop("host", None)
    settings.pop("port", None)
    tls = "SSL" in pool.connection_class.__name__
    if tls:
        settings.update(_tls_of(given))
    manager = pool.sentinel_manager
    # How the sentinels are reached (credentials, TLS); their timeouts are the new client's.
    reach = {
        key: value
        for key, value in (getattr(manager, "sentinel_kwargs", None) or {}).items()
        if key in ("username", "password", "credential_provider") or key.startswith("ssl")
    }
    settings["sentinel"] = {
        "sentinels": [
            (kwargs.get("host", "localhost"), kwargs.get("port", 26379))
            for kwargs in map(connection_kwargs, manager.sentinels)
        ],
        "service": pool.service_name,
        "auth": reach,
        "ssl": tls,
        "min_other_sentinels": getattr(manager, "min_other_sentinels", 0),
        "force_master_ip": getattr(manager, "_force_master_ip", None),
    }
    return settings


def _sentinel_client(found: dict[str, Any], timeout: float, **settings: Any) -> redis.Redis:
    """A client of the primary the sentinels in ``found`` name (see :func:`_sentinel_settings`)."""
    # The sentinels share half the wait per attempt, whatever the primary's reads
    # may wait: asking every one of them leaves room for the connect to the primary.
    addresses = [tuple(address) for address in found["sentinels"]]
    each = max(timeout / (2 * max(1, len(addresses))), _FLOOR)
    sentinels = redis.sentinel.Sentinel(
        addresses,
        min_other_sentinels=found.get("min_other_sentinels", 0),
        sentinel_kwargs={
            **found.get("auth", {}),
            "socket_timeout": each,
            "socket_connect_timeout": each,
        },
        force_master_ip=found.get("force_master_ip"),
    )
    if found.get("ssl"):
        settings["ssl"] = True
    client: redis.Redis = sentinels.master_for(found["service"], **settings)
    return client


def client_settings(client: redis.Redis) -> dict[str, Any]:
    """Return the ``redis.Redis`` keywords that reach the server ``client`` reaches.

    Server, database, credentials and TLS settings, without timeouts and
    retries: for :func:`client_like` in another process.

    Raises:
        TypeError: The client does not name its server (see :func:`client_like`).
    """
    return _settings_of(client.connection_pool)


def cluster_client(url: str, *, interval_ms: int, **options: Any) -> redis.RedisCluster:
    """Build a cluster client whose failed command returns within one tick interval.

    Example:
        >>> conn = cluster_client("redis://10.0.0.5:7000", interval_ms=7500)
        >>> manager = start_link(connection=conn, keys=QueueKeys("{myqueue}"))

    ``url`` names any node; ``interval_ms`` is the manager's tick interval;
    ``options`` for ``redis.RedisCluster`` override the timeouts and retries.
    """
    # The default windows: a lock of four intervals, a margin of half of one.
    seconds = command_timeout(Timing(4 * interval_ms), cluster=True)
    options.setdefault("socket_timeout", seconds)
    options.setdefault("socket_connect_timeout", seconds)
    options.setdefault("retry", Retry(NoBackoff(), RETRIES))
    return redis.RedisCluster.from_url(url, **options)


def is_cluster(conn: object) -> bool:
    """Whether ``conn`` is a ``redis.RedisCluster`` client."""
    return isinstance(conn, redis.RedisCluster)


def socket_timeout(conn: object) -> float | None:
    """Return the socket timeout a client was built with, in seconds, or ``None``."""
    value = connection_kwargs(conn).get("socket_timeout")
    return float(value) if value is not None else None


def encoding(conn: object) -> str:
    """Return the encoding a client uses for keys and arguments (``"utf-8"`` by default)."""
    return str(connection_kwargs(conn).get("encoding", "utf-8"))


def check_client(conn: object, keys: QueueKeys, timing: Timing, safety_margin: int) -> None:
    """Check a client given to a manager; warn when a hung call on it could last too long.

    Raises:
        TypeError: ``conn`` is not a ``redis.Redis`` or ``redis.RedisCluster``.
        ValueError: The client's encoding is not UTF-8, or the queue's keys
            cannot share one slot of the cluster it talks to.
    """
    if isinstance(conn, (redis.asyncio.Redis, redis.asyncio.RedisCluster)):
        sync = "RedisCluster" if isinstance(conn, redis.asyncio.RedisCluster) else "Redis"
        raise TypeError(
            f"connection is a redis.asyncio.{sync}; the manager renews from a thread of its "
            f"own and needs a synchronous client: pass the server's URL instead "
            f"(connection={describe_connection(conn)!r}, with the password if it has one), "
            f"or a redis.{sync}"
        )
    if not isinstance(conn, (redis.Redis, redis.RedisCluster)):
        kind = type(conn)
        named = kind.__qualname__
        if kind.__module__ != "builtins":
            named = f"{kind.__module__}.{named}"
        raise TypeError(
            f"connection must be a redis.Redis, a redis.RedisCluster or a URL, got {named}"
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
    limit = command_timeout(timing, safety_margin, cluster=cluster)
    given = socket_timeout(conn)
    if given is not None and given <= limit:
        return
    if cluster:
        fix = f"build it with actors.connection.cluster_client(url, interval_ms={timing.interval})"
    else:
        fix = f"pass socket_timeout={limit:g} (or less), or pass a URL"
    what = "no socket_timeout" if given is None else f"socket_timeout={given:g} s"
    logger.warning(
        "LockManager for queue %r: the client has %s, but a renewal answered after %g s "
        "per attempt can no longer keep a %d ms lock's deadline, and a hung one holds back "
        "every renewal after it; %s",
        keys.name,
        what,
        limit,
        timing.lock_duration,
        fix,
        extra={"queue": keys.name},
    )


def connection_kwargs(conn: object) -> dict[str, Any]:
    """Return the keywords a client's connections are built with (its pool's or nodes')."""
    pool = getattr(conn, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", None)
    if kwargs is None:
        nodes = getattr(conn, "nodes_manager", None)
        kwargs = getattr(nodes, "connection_kwargs", None) or {}
    return dict(kwargs)


def redacted_url(url: str) -> str:
    """Return ``url`` with its password, if any, replaced by ``***``."""
    sentinel = _sentinel_parts(url)
    if sentinel is not None:
        # Split as the Sentinel URL's own reader splits it, whatever the password holds.
        scheme, userinfo, hosts, path = sentinel
        if userinfo is None:
            return url
        user, colon, _ = userinfo.partition(":")
        return f"{scheme}://{user}{':***' if colon else ''}@{hosts}/{path}"
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return "<a URL that does not parse>"
    if password is None:
        # Fail closed: user info the split did not see (a password holding '#',
        # '?' or '/') is not printed.
        cut = "@" in url and "@" not in parts.netloc
        return "<a URL whose password is not shown>" if cut else url
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}"))


def describe_connection(conn: object) -> str:
    """Return the server a client or URL reaches, as a URL with the password masked.

    ``rediss://user:***@host:6380/2``, ``unix:///run/redis.sock?db=0``, a
    cluster's first startup node, or else the client's type.
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
    if isinstance(pool, (redis.sentinel.SentinelConnectionPool, SentinelPoolAsync)):
        sentinels = ",".join(_address(sentinel) for sentinel in pool.sentinel_manager.sentinels)
        tls = "s" if "SSL" in getattr(kind, "__name__", "") else ""
        where = f"{sentinels}/{quote(pool.service_name)}/{kwargs.get('db', 0)}"
        return f"{_scheme_auth(f'redis{tls}+sentinel', kwargs)}{where}"
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


def _address(client: Any) -> str:
    kwargs = connection_kwargs(client)
    host = str(kwargs.get("host", "?"))
    return f"{f'[{host}]' if ':' in host else host}:{kwargs.get('port', 26379)}"


def _scheme_auth(scheme: str, kwargs: dict[str, Any]) -> str:
    user = kwargs.get("username") or ""
    if kwargs.get("password") is not None:
        return f"{scheme}://{quote(user)}:***@"
    if user:
        return f"{scheme}://{quote(user)}@"
    return f"{scheme}://"


def unreachable_message(conn: object, queue: str, exc: BaseException) -> str:
    """Say that a manager cannot reach its server, where it looked, and what to check."""
    where = describe_connection(conn)
    cause = " ".join(f"{type(exc).__name__}: {exc}".split())
    if isinstance(exc, redis.AuthenticationError):
        check = "the username and password"
    elif isinstance(exc, redis.sentinel.MasterNotFoundError):
        # Its text lists every sentinel client at length: the first clause says it.
        cause = cause.split(" : ", 1)[0]
        check = (
            "that the sentinels run and listen there, that they monitor this service name "
            "(sentinel monitor <name> ...), and that no firewall is in the way"
        )
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
