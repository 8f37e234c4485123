"""A client built from another shape of settings reaches the same server, bounded."""

from __future__ import annotations

import asyncio
import logging
import pickle
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis
import redis.asyncio
import redis.asyncio.sentinel
import redis.sentinel

from actors import QueueKeys, Timing, start_link, stop, track_job
from actors.connection import (
    SentinelURL,
    client_for_url,
    client_like,
    client_settings,
    command_timeout,
    connection_kwargs,
    describe_connection,
    parse_sentinel_url,
    socket_timeout,
)
from actors.embedded import EmbeddedServer
from tests.support.polling import wait_for
from tests.support.recorder import Recorder
from tests.support.server import Server

#: The lock TTL of the managers started here, in milliseconds (a tick every 100 ms).
LOCK_MS = 400
#: The wait per attempt of the clients built here: the rule's, for those managers.
TIMEOUT = command_timeout(Timing(LOCK_MS))


def _host_port(server: Server) -> tuple[str, int]:
    parts = urlsplit(server.url)
    assert parts.hostname is not None and parts.port is not None
    return parts.hostname, parts.port


def _reaches(conn: redis.Redis, server: Server, db: int) -> bool:
    """Whether ``conn`` writes where a client of ``server``'s database ``db`` reads."""
    conn.set("reached", "yes")
    host, port = _host_port(server)
    probe = redis.Redis(host=host, port=port, db=db, socket_timeout=5)
    try:
        return probe.get("reached") == b"yes"
    finally:
        probe.delete("reached")
        probe.close()


@pytest.mark.parametrize("shape", ["url", "dict", "client", "asyncio_client", "pool_dict"])
def test_every_shape_reaches_the_same_database_with_the_bounded_timeout(
    server: Server, shape: str
) -> None:
    host, port = _host_port(server)
    given: Any = {
        "url": f"redis://{host}:{port}/2",
        "dict": {"host": host, "port": port, "db": 2},
        "client": redis.Redis(host=host, port=port, db=2),
        "asyncio_client": redis.asyncio.Redis(host=host, port=port, db=2),
        "pool_dict": {"connection_pool": redis.asyncio.ConnectionPool(host=host, port=port, db=2)},
    }[shape]

    conn = client_like(given, timeout=TIMEOUT)

    try:
        assert _reaches(conn, server, db=2)
        assert socket_timeout(conn) == TIMEOUT
    finally:
        conn.close()


def test_settings_that_would_unbound_or_rename_the_client_are_not_copied(server: Server) -> None:
    host, port = _host_port(server)
    given = {
        "host": host,
        "port": port,
        "socket_timeout": None,
        "retry_on_timeout": True,
        "client_name": "bull:d29ya2Vy",
        "decode_responses": True,
    }

    conn = client_like(given, timeout=TIMEOUT)

    try:
        # Bounded, nameless (not listed among the queue's workers), bytes replies.
        assert socket_timeout(conn) == TIMEOUT
        assert conn.client_getname() is None
        conn.set("k", "v")
        assert conn.get("k") == b"v"
    finally:
        conn.delete("k")
        conn.close()


def test_a_unix_socket_client_is_copied_as_a_unix_socket_client() -> None:
    folder = Path(tempfile.mkdtemp(prefix="actors-sock-"))
    path = str(folder / "s.sock")
    with EmbeddedServer(extra_args=["--unixsocket", path, "--unixsocketperm", "700"]) as private:
        original = redis.asyncio.Redis(unix_socket_path=path)

        conn = client_like(original, timeout=TIMEOUT)

        try:
            assert conn.connection_pool.connection_kwargs["path"] == path
            assert conn.ping()
            conn.set("via", "socket")
            tcp = redis.Redis.from_url(private.url, socket_timeout=5)
            assert tcp.get("via") == b"socket"
            tcp.close()
        finally:
            conn.close()
            asyncio.run(original.aclose())


def test_the_original_client_is_left_alone(server: Server) -> None:
    original = redis.Redis.from_url(server.url, socket_timeout=30)

    conn = client_like(original, timeout=TIMEOUT)

    assert conn is not original
    assert socket_timeout(original) == 30
    conn.close()
    assert original.ping()
    original.close()


@pytest.mark.parametrize(
    ("given", "fix"),
    [
        (object(), "URL, a dict"),
        (42, "got int"),
        (b"redis://localhost", "got bytes"),
    ],
)
def test_a_shape_it_cannot_copy_is_refused_naming_the_shapes(given: object, fix: str) -> None:
    with pytest.raises(TypeError, match=fix):
        client_like(given, timeout=TIMEOUT)


def test_a_cluster_client_is_refused_with_the_builder_to_use() -> None:
    # Built without contacting a node: only its type is looked at.
    cluster = redis.RedisCluster.__new__(redis.RedisCluster)
    with pytest.raises(TypeError, match=r"cluster_client\(url, interval_ms=\.\.\.\)"):
        client_like(cluster, timeout=TIMEOUT)


#: A Sentinel's address; nothing connects to it (the pools connect lazily).
SENTINEL = ("127.0.0.1", 26379)


def _not_naming_its_server(shape: str) -> object:
    """A client, or a dict holding a pool, whose settings do not say which server it reaches."""
    # Any: redis-py typed its sentinel classes only in later releases.
    sentinel_module: Any = redis.sentinel
    if shape == "pool_dict_no_host":
        return {"connection_pool": redis.asyncio.ConnectionPool()}
    if shape == "asyncio_sentinel_client":
        async_sentinel_module: Any = redis.asyncio.sentinel
        return async_sentinel_module.Sentinel([SENTINEL]).master_for("m")
    sentinel = sentinel_module.Sentinel([SENTINEL])
    if shape == "sentinel_pool_dict":
        return {"connection_pool": sentinel_module.SentinelConnectionPool("m", sentinel)}
    return sentinel.master_for("m")


@pytest.mark.parametrize("shape", ["pool_dict_no_host"])
def test_a_client_that_does_not_name_its_server_is_refused_asking_for_the_client(
    shape: str,
) -> None:
    given = _not_naming_its_server(shape)

    # A copy of its settings would reach localhost:6379, not its server.
    with pytest.raises(TypeError, match=r"use_actor_lock_manager\(worker, connection=\.\.\.\)"):
        client_like(given, timeout=TIMEOUT)


def test_an_asyncio_client_is_refused_naming_its_module_and_the_url_to_pass(
    server: Server,
) -> None:
    # Given the asyncio client an async program already has
    given = redis.asyncio.Redis.from_url(server.url)
    url = describe_connection(given)

    # when it is passed to a manager, the error names the asyncio module and
    # gives the URL to pass instead
    with pytest.raises(TypeError, match=r"redis\.asyncio\.Redis") as refused:
        start_link(connection=given, keys=QueueKeys("q"))  # type: ignore[arg-type]
    assert f"connection={url!r}" in str(refused.value)
    # and that URL starts a manager on the same server
    stop(start_link(connection=url, keys=QueueKeys("q")))


@pytest.mark.parametrize(
    ("given", "described"),
    [
        ("redis://:s3cret@db.example:6380/2", "redis://:***@db.example:6380/2"),
        (redis.Redis.from_url("rediss://app:s3cret@db.example:6380/2"), "rediss://app:***@"),
        (redis.Redis(unix_socket_path="/run/r.sock", password="s3cret"), "unix:///run/r.sock"),
        (redis.Redis(host="h", port=7000, db=1), "redis://h:7000/1"),
        (
            "redis+sentinel://:s3cret@s1:26379,s2:26380/mymaster/2",
            "redis+sentinel://:***@s1:26379,s2:26380/mymaster/2",
        ),
        (
            client_for_url("redis+sentinel://app:s3cret@s1,s2:26380/mymaster/2", timeout=TIMEOUT),
            "redis+sentinel://app:***@s1:26379,s2:26380/mymaster/2",
        ),
    ],
)
def test_a_connection_is_described_with_its_password_masked(given: object, described: str) -> None:
    text = describe_connection(given)

    assert described in text
    assert "s3cret" not in text


def test_an_unreachable_server_is_named_once_with_what_to_check(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Given a manager whose server does not answer (nothing listens on port 1),
    # with a password in its URL
    recorder = Recorder()
    url = "redis://:s3cret@127.0.0.1:1/0"
    with caplog.at_level(logging.WARNING, logger="actors"):
        manager = recorder.start(url, QueueKeys("q"), lock_duration=LOCK_MS)
        try:
            # when a tracked job's renewal fails tick after tick
            track_job(manager, "j", "t")
            wait_for(lambda: len(recorder.errors()) >= 3, 10 * LOCK_MS / 1000, "three failed ticks")
        finally:
            stop(manager)

    # then one line, from its start to its stop, says where it looked and what to check
    said = [r.getMessage() for r in caplog.records if "cannot reach" in r.getMessage()]
    assert len(said) == 1
    assert "redis://:***@127.0.0.1:1/0" in said[0]
    assert "check that the server runs" in said[0]
    # and the password is nowhere in the log
    assert "s3cret" not in caplog.text


@pytest.mark.parametrize("encoding", ["latin-1", "utf-16"])
def test_a_client_that_is_not_utf8_is_refused(server: Server, encoding: str) -> None:
    # msgpack packs the script's arguments as UTF-8: keys encoded otherwise
    # would name other locks.
    client = redis.Redis.from_url(server.url, encoding=encoding, socket_timeout=0.05)
    with pytest.raises(ValueError, match="UTF-8"):
        start_link(connection=client, keys=QueueKeys("connection"), lock_duration=LOCK_MS)
    client.close()


def test_a_client_timeout_that_breaks_the_rule_is_warned_with_one_number(
    server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    client = redis.Redis.from_url(server.url, socket_timeout=2)
    with caplog.at_level(logging.WARNING, logger="actors"):
        manager = start_link(connection=client, keys=QueueKeys("connection"), lock_duration=2000)
    stop(manager)
    client.close()
    # The rule's one number for a 2000 ms lock: (2000 - 250 - 500) / 2 ms per attempt
    limit = command_timeout(Timing(2000))
    assert limit == 0.625
    assert "socket_timeout=2 s" in caplog.text
    assert f"answered after {limit:g} s per attempt" in caplog.text
    assert f"pass socket_timeout={limit:g} (or less)" in caplog.text


@pytest.mark.parametrize(
    ("url", "read"),
    [
        (
            "redis+sentinel://s1,s2:26380/mymaster",
            SentinelURL([("s1", 26379), ("s2", 26380)], "mymaster", 0, None, None, ssl=False),
        ),
        (
            "rediss+sentinel://app:p%40ss@[::1]:5000/my%20primary/3",
            SentinelURL([("::1", 5000)], "my primary", 3, "app", "p@ss", ssl=True),
        ),
        ("redis://h:6379/0", None),
    ],
)
def test_a_sentinel_url_names_its_sentinels_service_and_database(
    url: str, read: SentinelURL | None
) -> None:
    assert parse_sentinel_url(url) == read


@pytest.mark.parametrize(
    ("url", "match"),
    [
        ("redis+sentinel://s1:26379", "names the primary's service"),
        ("redis+sentinel:///mymaster", "at least one sentinel"),
        ("redis+sentinel://s1:port/mymaster", "ports are numbers from 1 to 65535"),
        ("redis+sentinel://s1/mymaster/one", "database is a number"),
    ],
)
def test_a_sentinel_url_missing_a_part_is_refused_saying_which(url: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        client_for_url(url, timeout=TIMEOUT)


def test_a_sentinel_url_builds_a_bounded_client_that_asks_the_sentinels() -> None:
    client = client_for_url("redis+sentinel://:pw@127.0.0.1:1/mymaster/4", timeout=TIMEOUT)
    pool = client.connection_pool
    assert isinstance(pool, redis.sentinel.SentinelConnectionPool)
    assert pool.service_name == "mymaster"
    assert socket_timeout(client) == TIMEOUT
    assert pool.connection_kwargs["db"] == 4
    assert pool.connection_kwargs["password"] == "pw"
    # No sentinel answers on port 1: the client says so within its timeout.
    with pytest.raises(redis.sentinel.MasterNotFoundError):
        client.ping()


@pytest.mark.parametrize("shape", ["sentinel_client", "asyncio_sentinel_client"])
def test_a_sentinel_managed_client_is_copied_as_one_that_asks_the_same_sentinels(
    shape: str,
) -> None:
    given: Any = _not_naming_its_server(shape)
    # What a child process builds its client from: plain data that crosses a pickle.
    settings = pickle.loads(pickle.dumps(client_settings(given)))
    copy = client_like(settings, timeout=TIMEOUT)
    pool = copy.connection_pool
    assert isinstance(pool, redis.sentinel.SentinelConnectionPool)
    assert pool.service_name == "m"
    assert [connection_kwargs(s)["port"] for s in pool.sentinel_manager.sentinels] == [SENTINEL[1]]
    assert socket_timeout(copy) == TIMEOUT
    assert describe_connection(copy).startswith("redis+sentinel://")
