"""Fixtures for the interop tests: BullMQ's Python and Node.js runtimes as peers.

The Node.js peer needs ``node`` (20 or later) on PATH; its packages are
installed from ``node/package-lock.json`` into ``node/node_modules`` on first
use. Without ``node`` its tests are skipped, saying so; a failed install fails
them.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from actors import ManagerRef, QueueKeys
from tests.interop.peers import (
    LOCK_MS,
    NODE_DIR,
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

#: Longest time ``npm install`` may take, in seconds.
NPM_INSTALL_TIMEOUT_S = 300


def _pinned_versions() -> dict[str, str]:
    manifest = json.loads((NODE_DIR / "package.json").read_text(encoding="utf-8"))
    pins: dict[str, str] = manifest["dependencies"]
    return pins


def _installed_version(package: str) -> str | None:
    manifest = NODE_DIR / "node_modules" / package / "package.json"
    if not manifest.is_file():
        return None
    version: str = json.loads(manifest.read_text(encoding="utf-8"))["version"]
    return version


def _stale_packages() -> list[str]:
    return [
        f"{package}@{pin} (found {_installed_version(package) or 'nothing'})"
        for package, pin in _pinned_versions().items()
        if _installed_version(package) != pin
    ]


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

    Runs ``npm install --no-audit --no-fund`` (which follows the committed
    lock file) when a pinned package is missing or at another version. A
    failed install fails the test: only a missing ``node`` skips.
    """
    # Parallel test runs share the folder: one installs, the others wait.
    digest = hashlib.sha1(str(NODE_DIR).encode()).hexdigest()[:12]
    lock_path = Path(tempfile.gettempdir()) / f"echomq-interop-npm-{digest}.lock"
    with lock_path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _stale_packages():
            npm = shutil.which("npm")
            if npm is None:
                pytest.fail(f"`node` is at {node_executable} but `npm` is not on PATH")
            try:
                result = subprocess.run(
                    [npm, "install", "--no-audit", "--no-fund"],
                    cwd=NODE_DIR,
                    capture_output=True,
                    text=True,
                    timeout=NPM_INSTALL_TIMEOUT_S,
                    check=False,
                )
            except subprocess.TimeoutExpired:
                pytest.fail(f"npm install in {NODE_DIR} took over {NPM_INSTALL_TIMEOUT_S}s")
            if result.returncode != 0:
                pytest.fail(
                    f"npm install in {NODE_DIR} failed ({result.returncode}):\n"
                    f"{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
                )
            stale = _stale_packages()
            if stale:
                pytest.fail(f"npm install in {NODE_DIR} left wrong versions: {', '.join(stale)}")
    return NODE_DIR / "node_modules"


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
