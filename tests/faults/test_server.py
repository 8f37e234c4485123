"""Server faults: a hung process, a crash with and without its data, a busy script.

The manager gets the server's URL, so its client has a socket timeout of a
quarter of the timer interval and one immediate retry.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

import pytest
import redis

from actors import Timing, get_active_job_count, get_stats
from actors.connection import client_for_url, command_timeout, socket_timeout
from actors.embedded import EmbeddedServer
from tests.faults.conftest import JOBS, KEYS, first_round_s, start_tracking, track_fresh
from tests.support import lost_locks, lowest_pttl

if TYPE_CHECKING:
    from collections.abc import Iterator

    from tests.faults.conftest import FaultRecord
    from tests.support import Recorder


def built_timeout(url: str, lock_ms: int) -> float:
    """The socket timeout of the client a manager builds for ``url``, in seconds."""
    client = client_for_url(url, timeout=command_timeout(Timing(lock_ms)))
    timeout = socket_timeout(client)
    client.close()
    assert timeout is not None
    return timeout


def test_hung_server_never_hangs_queries_to_the_manager(
    private_server: EmbeddedServer, direct: redis.Redis, reports: Recorder, record: FaultRecord
) -> None:
    # Given 20 locks of 4 s renewed by a manager (1 s ticks, 250 ms socket timeout)
    lock_ms = 4000
    timing = Timing(lock_ms)
    manager, jobs = start_tracking(private_server.url, direct, reports, lock_ms)
    timeout = built_timeout(private_server.url, lock_ms)
    record.fault = "server hangs (SIGSTOP), then resumes"
    record.asserted = "asks answered at once (the renewal waits on its own thread); no lock lost"

    # When the server is frozen for two ticks while a caller keeps asking
    paused = time.monotonic()
    private_server.pause()
    slowest = 0.0
    answers = set()
    try:
        while time.monotonic() - paused < 2 * timing.interval / 1000:
            asked = time.monotonic()
            answers.add(get_active_job_count(manager, timeout=10))
            slowest = max(slowest, time.monotonic() - asked)
            time.sleep(0.02)
    finally:
        private_server.resume()
    resumed = time.monotonic()

    # Then every ask was answered at once, far within one socket timeout: the
    # manager's thread never waits for Redis
    record.notes = {"slowest_ask_s": round(slowest, 3), "socket_timeout_s": timeout}
    assert answers == {JOBS}
    assert slowest < timeout

    # And the locks are renewed after the server resumes, none lost
    reports.wait_renewed(jobs, 2 * timing.interval / 1000 + 3, since=resumed)
    record.locks_lost = len(lost_locks(direct, KEYS, jobs))
    record.count_reports(reports)
    assert record.locks_lost == 0
    assert record.false_reports == 0


def test_server_restarted_empty_reports_every_job_once_then_renews_new_ones(
    private_server: EmbeddedServer, direct: redis.Redis, reports: Recorder, record: FaultRecord
) -> None:
    # Given 20 tracked jobs on a server without persistence
    lock_ms = 2000
    timing = Timing(lock_ms)
    manager, jobs = start_tracking(private_server.url, direct, reports, lock_ms)
    record.fault = "server killed, restarted empty"
    record.asserted = "every job reported lost exactly once; new jobs renewed after"

    # When it crashes, stays down for a failed tick, and comes back empty
    killed = time.monotonic()
    private_server.kill()
    reports.wait(
        lambda: reports.errors(since=killed),
        timeout=2 * timing.interval / 1000 + 3,
        what="on_error while the server is down",
    )
    private_server.start()

    # Then each job is reported lost once and untracked
    reports.wait(
        lambda: len(reports.lost()) >= JOBS,
        timeout=first_round_s(lock_ms),
        what="the lost jobs to be reported",
    )
    assert get_active_job_count(manager, timeout=5) == 0

    # And jobs taken after the restart are renewed (the script is loaded again)
    fresh = track_fresh(manager, direct, reports, lock_ms, 5)
    record.count_reports(reports, lost=jobs)
    record.locks_lost = len(lost_locks(direct, KEYS, fresh))
    assert reports.lost_counts() == dict.fromkeys(jobs, 1)
    assert record.locks_lost == 0
    assert get_stats(manager, timeout=5).tracked == len(fresh)


def test_server_restarted_from_its_append_only_file_inside_the_ttl_loses_no_job(
    aof_server: EmbeddedServer, reports: Recorder, record: FaultRecord
) -> None:
    # Given 20 locks of 4 s on a server with an append-only file
    lock_ms = 4000
    direct = redis.Redis.from_url(aof_server.url, socket_timeout=10)
    manager, jobs = start_tracking(aof_server.url, direct, reports, lock_ms)
    record.fault = "server killed, restarted from its AOF"
    record.asserted = "no job lost or reported; renewals go on"

    # When it crashes and restarts at once, well inside the TTL
    aof_server.restart()
    restarted = time.monotonic()

    # Then every job is renewed twice more and none is reported lost
    for _ in range(2):
        since = time.monotonic()
        reports.wait_renewed(jobs, first_round_s(lock_ms), since=since)
    record.locks_lost = len(lost_locks(direct, KEYS, jobs))
    record.count_reports(reports)
    record.notes = {"renewing_after_s": round(time.monotonic() - restarted, 2)}
    assert record.locks_lost == 0
    assert record.false_reports == 0
    assert get_active_job_count(manager, timeout=5) == JOBS
    direct.close()


@pytest.fixture(params=["valkey", "redis"])
def busy_server(request: pytest.FixtureRequest) -> Iterator[EmbeddedServer]:
    server = EmbeddedServer(request.param).start()
    try:
        yield server
    finally:
        server.stop()


def test_busy_script_of_another_client_is_retried_and_loses_no_job(
    busy_server: EmbeddedServer, reports: Recorder, record: FaultRecord
) -> None:
    # Given 20 locks of 4 s, and a server that answers BUSY after 100 ms of script
    lock_ms = 4000
    timing = Timing(lock_ms)
    direct = redis.Redis.from_url(busy_server.url, socket_timeout=10)
    # lua-time-limit is the name both engines accept (Valkey 8 aliases it).
    direct.config_set("lua-time-limit", 100)
    manager, jobs = start_tracking(busy_server.url, direct, reports, lock_ms)
    record.fault = f"BUSY: another client's slow script ({busy_server.engine})"
    record.asserted = "BUSY reported via on_error, retried, no job lost"

    # When another client runs a script that never ends, until a tick has met BUSY
    hog = redis.Redis.from_url(busy_server.url, socket_timeout=30)
    outcome: list[BaseException] = []

    def run_forever() -> None:
        try:
            hog.eval("while true do end", 0)
        except redis.RedisError as exc:
            outcome.append(exc)

    busy_since = time.monotonic()
    thread = threading.Thread(target=run_forever, name="busy-script")
    thread.start()
    try:
        reports.wait(
            lambda: any("BUSY" in str(exc) for exc in reports.errors(since=busy_since)),
            timeout=2 * timing.interval / 1000 + 3,
            what="a tick to meet BUSY",
        )
    finally:
        # SCRIPT KILL is one of the few commands a busy server still runs.
        deadline = time.monotonic() + 10
        while thread.is_alive() and time.monotonic() < deadline:
            try:
                direct.script_kill()
            except redis.ResponseError:
                time.sleep(0.05)
            thread.join(timeout=0.5)
    killed = time.monotonic()
    lowest_ttl = lowest_pttl(direct, KEYS, jobs)

    # Then the next ticks renew every job, none is reported lost
    reports.wait_renewed(jobs, 2 * timing.interval / 1000 + 3, since=killed)
    record.locks_lost = len(lost_locks(direct, KEYS, jobs))
    record.count_reports(reports)
    record.notes = {"busy_s": round(killed - busy_since, 2), "lowest_ttl_ms": lowest_ttl}
    assert outcome and "killed" in str(outcome[0]).lower()
    assert record.locks_lost == 0
    assert record.false_reports == 0
    assert get_active_job_count(manager, timeout=5) == JOBS
    hog.close()
    direct.close()
