"""Fixtures for the interop tests: BullMQ's Python and Node.js runtimes as peers.

The Node.js peer needs ``node`` (20 or later) on PATH; its packages are
installed from ``node/package-lock.json`` into ``node/node_modules`` on first
use. Without ``node`` its tests are skipped, saying so; a failed install fails
them.
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from actors import ManagerRef, QueueKeys
from tests.interop.node_packages import ensure as node_packages_ensure
from tests.interop.peers import (
    LOCK_MS,
    PREFIX,
    RENEW_MS,
    NodePeer,
    Peer,
    PythonPeer,
)

if TYPE_CHECKING:
    from collections.abc import Iterator

    import redis

    from tests.conftest import Server, StartManager


@pytest.fixture(scope="session")
def node_executable() -> str:
    """The ``node`` executable; the Node.js peer's tests skip without it."""
    node = shutil.which("node")
    if node is None:
        pytest.skip(
            "Node.js is not installed (no `node` on PATH), so the BullMQ Node.js peer "
            "cannot run; install Node.js 20+ to run these interop tests"
        )
    return node


@pytest.fixture(scope="session")
def node_packages(node_executable: str) -> Path:
    """``node/node_modules`` holding the pinned ``bullmq`` and ``ioredis``.

    Installed on first use (:func:`tests.interop.node_packages.ensure`). A
    failed install fails the test: only a missing ``node`` skips.
    """
    try:
        return node_packages_ensure()
    except RuntimeError as error:
        pytest.fail(f"{error} (node is at {node_executable})")


@pytest.fixture
def keys() -> QueueKeys:
    """A fresh queue under BullMQ's prefix: ``bull:interop-xxxxxxxx:...``."""
    return QueueKeys(f"interop-{uuid.uuid4().hex[:8]}", prefix=PREFIX)


@pytest.fixture
def python_peer(
    engine_server: Server, engine_client: redis.Redis, keys: QueueKeys
) -> Iterator[PythonPeer]:
    """bullmq-py on the engine's server (flushed first, by ``engine_client``)."""
    peer = PythonPeer(engine_server.url, keys.name)
    yield peer
    peer.close()


@pytest.fixture
def node_peer(
    node_executable: str,
    node_packages: Path,
    engine_server: Server,
    engine_client: redis.Redis,
    keys: QueueKeys,
    tmp_path: Path,
) -> Iterator[NodePeer]:
    """BullMQ for Node.js on the engine's server, in its own process."""
    peer = NodePeer(node_executable, engine_server.url, keys.name, tmp_path / "node-stderr.log")
    yield peer
    peer.close()


@pytest.fixture(params=["python", pytest.param("node", marks=pytest.mark.node)])
def peer(request: pytest.FixtureRequest) -> Peer:
    """Each BullMQ runtime in turn: bullmq-py, then BullMQ for Node.js."""
    found: Peer = request.getfixturevalue(f"{request.param}_peer")
    return found


@pytest.fixture
def manager(
    engine_server: Server, engine_client: redis.Redis, keys: QueueKeys, start_manager: StartManager
) -> ManagerRef:
    """Our lock manager on the same queue, with BullMQ's lock duration."""
    return start_manager(
        connection=engine_server.url, keys=keys, lock_duration=LOCK_MS, lock_renew_time=RENEW_MS
    )
