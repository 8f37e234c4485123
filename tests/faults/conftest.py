"""Fixtures for the fault suite: a private server per test, a fault proxy, a callback log.

Each test that injects a fault owns its server (it may pause, kill or
reconfigure it) and reaches it through a :class:`FaultProxy`. A second,
direct client sees the server as a stalled checker would, to check the locks.
Every test fills a :class:`FaultRecord`; ``tests/faults/report.py`` turns
them into the README's table.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import pytest
import redis

from actors import ManagerRef, QueueKeys, Timing, start_link, track_job
from actors.embedded import EmbeddedServer
from tests.faults.proxy import FaultProxy
from tests.support import Recorder, default_engine, job_ids, take_locks

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

KEYS = QueueKeys("faults")

#: Jobs each scenario that starts with :func:`start_tracking` holds.
JOBS = 20


def first_round_s(lock_ms: int) -> float:
    """Seconds within which every tracked job is renewed at least once, with a margin.

    A job tracked just after a tick is first due two intervals later.
    """
    return 3 * Timing(lock_ms).interval / 1000 + 5


def start_tracking(
    connection: redis.Redis | str, direct: redis.Redis, reports: Recorder, lock_ms: int
) -> tuple[ManagerRef, dict[str, str]]:
    """Take :data:`JOBS` locks, track them over ``connection`` and wait for their first renewal.

    Args:
        connection: What the manager renews through: a URL (it then builds
            its own bounded client) or a client.
        direct: A client of the server that bypasses any proxy.
        reports: The recorder whose callbacks the manager gets.
        lock_ms: The locks' TTL and the manager's ``lock_duration``.

    Returns:
        The manager and each job's token.
    """
    # Taken for as long as the wait for the first round, not for lock_ms: a
    # machine that stalls during the setup must not fail the scenario before
    # it starts. The first renewal sets every TTL to lock_ms.
    first_round = first_round_s(lock_ms)
    jobs = take_locks(direct, KEYS, job_ids(JOBS), int(first_round * 1000))
    manager = start_link(
        connection=connection, keys=KEYS, lock_duration=lock_ms, **reports.callbacks()
    )
    for job_id, token in jobs.items():
        track_job(manager, job_id, token)
    reports.wait_renewed(jobs, first_round)
    return manager, jobs


def track_fresh(
    manager: ManagerRef, direct: redis.Redis, reports: Recorder, lock_ms: int, count: int
) -> dict[str, str]:
    """Take ``count`` new locks, track them and wait until each was renewed; return the tokens."""
    fresh = take_locks(direct, KEYS, job_ids(count, "fresh"), lock_ms)
    since = time.monotonic()
    for job_id, token in fresh.items():
        track_job(manager, job_id, token)
    reports.wait_renewed(fresh, first_round_s(lock_ms), since=since)
    return fresh


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

    def count_reports(self, reports: Recorder, lost: Iterable[str] = ()) -> None:
        """Set :attr:`false_reports`: repeated reports, and reports of locks that were not lost.

        Args:
            reports: What the manager reported.
            lost: The ids whose lock really was lost.
        """
        explained = set(lost) & set(reports.lost_counts())
        self.false_reports = len(reports.lost()) - len(explained)


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
def reports() -> Recorder:
    """The manager's callbacks, recorded with the time each ran."""
    return Recorder()
