"""Network faults between the manager and the server, injected by a loopback proxy.

Every manager here gets the proxy's URL, so it builds its own client with a
socket timeout of a quarter of its timer interval and one immediate retry.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pytest
import redis

from actors import get_active_job_count, get_stats, start_link, track_job
from actors.schedule import Timing
from tests.faults.conftest import KEYS, dead_locks, min_pttl, seed_locks

if TYPE_CHECKING:
    import pykka

    from actors import LockManager
    from tests.faults.conftest import FaultRecord, Reports
    from tests.faults.proxy import FaultProxy, Mode

JOBS = 20


def start_tracking(
    proxy: FaultProxy, direct: redis.Redis, reports: Reports, lock_ms: int, **options: object
) -> tuple[pykka.ActorRef[LockManager], dict[str, str]]:
    """Seed JOBS locks, track them through the proxy and wait for their first renewal."""
    jobs = seed_locks(direct, JOBS, lock_ms)
    manager = start_link(
        connection=options.pop("connection", proxy.url),  # type: ignore[arg-type]
        keys=KEYS,
        lock_duration=lock_ms,
        **reports.callbacks(),
    )
    for job_id, token in jobs.items():
        track_job(manager, job_id, token)
    timing = Timing(lock_ms)
    # Tracked jobs are first due two intervals later at the latest.
    reports.wait(
        lambda: reports.renewed_since(0) >= set(jobs),
        timeout=3 * timing.interval / 1000 + 5,
        what="the first renewal of every job",
    )
    return manager, jobs


@pytest.mark.parametrize("mode", ["blackhole", "reset"])
def test_outage_shorter_than_ttl_loses_nothing_and_the_first_tick_after_renews(
    mode: Mode, proxy: FaultProxy, direct: redis.Redis, reports: Reports, record: FaultRecord
) -> None:
    # Given 20 locks of 4 s, renewed through the proxy (1 s ticks, 250 ms socket timeout)
    lock_ms = 4000
    timing = Timing(lock_ms)
    manager, jobs = start_tracking(proxy, direct, reports, lock_ms)
    record.fault = f"{mode} shorter than the TTL" if mode == "blackhole" else "connection resets"
    record.asserted = (
        "no lock lost, no failure reported, on_error seen, the first tick after renews all"
    )

    # When the network fails until a renewing tick has failed
    outage_started = time.monotonic()
    proxy.mode = mode
    reports.wait(
        lambda: reports.errors_since(outage_started),
        timeout=2 * timing.interval / 1000 + 3,
        what="on_error during the outage",
    )
    # The ask is answered once the failed tick is over.
    before = get_stats(manager, timeout=10)
    lowest_ttl = min_pttl(direct, jobs)
    proxy.passthrough()
    recovered = time.monotonic()

    # Then the first tick after recovery renews every job
    reports.wait(
        lambda: reports.renewed_since(recovered) >= set(jobs),
        timeout=2 * timing.interval / 1000 + 3,
        what="renewal after recovery",
    )
    after = get_stats(manager, timeout=10)
    record.locks_lost = len(dead_locks(direct, jobs))
    record.false_reports = sum(reports.failed_counts().values())
    record.notes = {
        "outage_s": round(recovered - outage_started, 2),
        "lowest_ttl_ms": lowest_ttl,
        "errors": [type(exc).__name__ for exc in reports.errors_since(outage_started)],
    }
    assert after.ticks == before.ticks + 1
    assert after.errors == before.errors
    # And nothing was lost or reported lost, and the manager still answers
    assert record.locks_lost == 0
    assert record.false_reports == 0
    assert after.lost == 0
    assert lowest_ttl > 0
    assert all(
        isinstance(exc, (redis.ConnectionError, redis.TimeoutError))
        for exc in reports.errors_since(outage_started)
    )
    assert get_active_job_count(manager, timeout=5) == JOBS
    assert recovered - outage_started < lock_ms / 1000


def test_blackhole_longer_than_ttl_reports_every_expired_lock_exactly_once(
    proxy: FaultProxy, direct: redis.Redis, reports: Reports, record: FaultRecord
) -> None:
    # Given 20 locks of 2 s renewed through the proxy
    lock_ms = 2000
    timing = Timing(lock_ms)
    manager, jobs = start_tracking(proxy, direct, reports, lock_ms)
    record.fault = "blackhole longer than the TTL"
    record.asserted = "every expired or stolen lock reported exactly once, then untracked"

    # When the network is dark until every lock has expired, and meanwhile
    # another worker takes over five of the jobs
    proxy.blackhole()
    stolen = dict(list(jobs.items())[:5])
    thief = {job_id: "other-worker" for job_id in stolen}
    for job_id in stolen:
        direct.set(KEYS.lock(job_id), thief[job_id], px=60_000)
    expiring = {job_id: token for job_id, token in jobs.items() if job_id not in stolen}
    deadline = time.monotonic() + lock_ms / 1000 + 5
    while len(dead_locks(direct, expiring)) < len(expiring):
        assert time.monotonic() < deadline, "locks did not expire during the black-hole"
        time.sleep(0.05)
    proxy.passthrough()

    # Then every job is reported lost once, and no later tick reports it again
    reports.wait(
        lambda: sum(reports.failed_counts().values()) >= JOBS,
        timeout=3 * timing.interval / 1000 + 5,
        what="the lost locks to be reported",
    )
    ticks = get_stats(manager, timeout=5).ticks
    deadline = time.monotonic() + 3 * timing.interval / 1000 + 5
    while get_stats(manager, timeout=5).ticks < ticks + 3:
        assert time.monotonic() < deadline, "the manager stopped ticking"
        time.sleep(0.05)
    counts = reports.failed_counts()
    record.false_reports = sum(n - 1 for n in counts.values()) + len(set(counts) - set(jobs))
    record.locks_lost = 0
    record.notes = {"reported": len(counts)}
    assert counts == dict.fromkeys(jobs, 1)
    assert get_active_job_count(manager, timeout=5) == 0
    assert get_stats(manager, timeout=5).lost == JOBS
    # And the other worker's locks were not touched
    assert [direct.get(KEYS.lock(job_id)) for job_id in stolen] == [b"other-worker"] * 5

    # And a job tracked after recovery is renewed
    fresh = seed_locks(direct, 1, lock_ms, prefix="fresh")
    since = time.monotonic()
    for job_id, token in fresh.items():
        track_job(manager, job_id, token)
    reports.wait(
        lambda: reports.renewed_since(since) >= set(fresh),
        timeout=3 * timing.interval / 1000 + 5,
        what="renewal of a job tracked after recovery",
    )


def test_200ms_latency_per_round_trip_renews_every_lock_in_time(
    proxy: FaultProxy, direct: redis.Redis, reports: Reports, record: FaultRecord
) -> None:
    # Given a caller-built client whose socket timeout allows for a slow link
    lock_ms = 2000
    timing = Timing(lock_ms)
    client = redis.Redis.from_url(proxy.url, socket_timeout=2.0, socket_connect_timeout=2.0)
    record.fault = "200 ms latency per round trip"
    record.asserted = "every lock renewed in time, no error, no failure"

    manager, jobs = start_tracking(proxy, direct, reports, lock_ms, connection=client)

    # When every round trip takes 200 ms longer for four renewal rounds
    proxy.latency = 0.2
    started = time.monotonic()
    lowest = lock_ms
    while time.monotonic() - started < 4 * timing.renew_time / 1000:
        lowest = min(lowest, min_pttl(direct, jobs))
        time.sleep(0.1)

    # Then no lock came near expiry, and every tick paid the latency
    stats = get_stats(manager, timeout=5)
    record.locks_lost = len(dead_locks(direct, jobs))
    record.false_reports = sum(reports.failed_counts().values())
    record.notes = {"lowest_ttl_ms": lowest, "max_tick_ms": round(stats.max_tick_ms)}
    assert record.locks_lost == 0
    assert record.false_reports == 0
    assert stats.errors == 0
    assert stats.max_tick_ms >= 200
    assert lowest > 0
    assert reports.renewed_since(started) == set(jobs)
    client.close()
