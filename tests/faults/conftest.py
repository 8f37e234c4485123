"""Fixtures for the fault suite: a private server per test, a fault proxy, a callback log.

Each test that injects a fault owns its server (it may pause, kill or
reconfigure it) and reaches it through a :class:`FaultProxy`. A second,
direct client sees the server as a stalled checker would, to check the locks.
Every test fills a :class:`FaultRecord`; ``tests/faults/report.py`` turns
them into the README's table.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import pytest
import redis

from actors import QueueKeys
from actors.embedded import EmbeddedServer
from tests.conftest import default_engine
from tests.faults.proxy import FaultProxy

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

KEYS = QueueKeys("faults")


def wait_until(predicate: Callable[[], object], timeout: float, what: str) -> None:
    """Poll ``predicate`` until it is true; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.1f} s waiting for {what}")
        time.sleep(0.01)


def seed_locks(
    client: redis.Redis, count: int, ttl_ms: int, *, prefix: str = "job", keys: QueueKeys = KEYS
) -> dict[str, str]:
    """Take ``count`` locks as a worker would (SET PX); return id -> token."""
    jobs = {f"{prefix}-{i}": str(uuid.uuid4()) for i in range(count)}
    pipe = client.pipeline(transaction=False)
    for job_id, token in jobs.items():
        pipe.set(keys.lock(job_id), token, px=ttl_ms)
    pipe.execute()
    return jobs


def dead_locks(client: redis.Redis, jobs: dict[str, str], keys: QueueKeys = KEYS) -> list[str]:
    """Return the ids whose lock is gone or no longer holds the job's token."""
    pipe = client.pipeline(transaction=False)
    for job_id in jobs:
        pipe.get(keys.lock(job_id))
    values = pipe.execute()
    return [
        job_id
        for (job_id, token), value in zip(jobs.items(), values, strict=True)
        if value is None or value.decode() != token
    ]


def min_pttl(client: redis.Redis, jobs: dict[str, str], keys: QueueKeys = KEYS) -> int:
    """Return the smallest remaining TTL among the jobs' locks, in ms (-2: one is gone)."""
    pipe = client.pipeline(transaction=False)
    for job_id in jobs:
        pipe.pttl(keys.lock(job_id))
    ttls: list[int] = pipe.execute()
    return min(ttls)


class Reports:
    """The manager's callbacks, logged with the monotonic time they ran at."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.renewed: list[tuple[float, list[str]]] = []
        self.failed: list[tuple[float, list[str]]] = []
        self.errors: list[tuple[float, Exception]] = []

    def on_locks_renewed(self, ids: list[str]) -> None:
        with self._cond:
            self.renewed.append((time.monotonic(), list(ids)))
            self._cond.notify_all()

    def on_lock_renewal_failed(self, ids: list[str]) -> None:
        with self._cond:
            self.failed.append((time.monotonic(), list(ids)))
            self._cond.notify_all()

    def on_error(self, exc: Exception) -> None:
        with self._cond:
            self.errors.append((time.monotonic(), exc))
            self._cond.notify_all()

    def callbacks(self) -> dict[str, Any]:
        """Keyword arguments for ``start_link``."""
        return {
            "on_locks_renewed": self.on_locks_renewed,
            "on_lock_renewal_failed": self.on_lock_renewal_failed,
            "on_error": self.on_error,
        }

    def wait(self, predicate: Callable[[], object], timeout: float, what: str) -> None:
        """Wait until ``predicate`` (called under the log's lock) is true."""
        with self._cond:
            if not self._cond.wait_for(predicate, timeout):
                pytest.fail(f"timed out after {timeout:.1f} s waiting for {what}")

    def renewed_since(self, since: float) -> set[str]:
        """Ids renewed by callbacks that ran after ``since``."""
        with self._cond:
            return {i for at, ids in self.renewed if at > since for i in ids}

    def errors_since(self, since: float) -> list[Exception]:
        with self._cond:
            return [exc for at, exc in self.errors if at > since]

    def failed_counts(self) -> Counter[str]:
        """How many times each id was reported lost."""
        with self._cond:
            return Counter(i for _, ids in self.failed for i in ids)


@dataclass
class FaultRecord:
    """One row of the fault table; each test fills it in."""

    fault: str = ""
    asserted: str = ""
    #: Locks that should have stayed alive but were gone or stolen at the end.
    locks_lost: int = 0
    #: Ids reported lost that were not, or reported more than once.
    false_reports: int = 0
    #: Manager restarts a supervisor made.
    restarts: int = 0
    notes: dict[str, Any] = field(default_factory=dict)


@pytest.fixture
def record(request: pytest.FixtureRequest) -> Iterator[FaultRecord]:
    """The test's row of the fault table, attached to its report at teardown."""
    row = FaultRecord()
    yield row
    request.node.user_properties.append(("fault", asdict(row)))


@pytest.fixture
def private_server() -> Iterator[EmbeddedServer]:
    """A server this test alone uses, so it may pause, kill or reconfigure it."""
    server = EmbeddedServer(default_engine()).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def aof_server() -> Iterator[EmbeddedServer]:
    """A private server with an append-only file (fsync always)."""
    server = EmbeddedServer(default_engine(), appendonly=True).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def proxy(private_server: EmbeddedServer) -> Iterator[FaultProxy]:
    """A fault proxy in front of the private server, passing traffic."""
    with FaultProxy(private_server.host, private_server.port) as fault_proxy:
        yield fault_proxy


@pytest.fixture
def direct(private_server: EmbeddedServer) -> Iterator[redis.Redis]:
    """A client of the private server that bypasses the proxy."""
    client = redis.Redis.from_url(private_server.url, socket_timeout=10)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def reports() -> Reports:
    return Reports()
