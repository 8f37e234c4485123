"""Network faults between the manager and the server, injected by a loopback proxy.

Every manager here gets the proxy's URL, so it builds its own client with a
socket timeout of a quarter of its timer interval and one immediate retry.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from actors import Timing, get_active_job_count, get_stats, start_link, stop, track_job
from tests.faults.conftest import JOBS, KEYS, first_round_s, start_tracking, track_fresh
from tests.support import (
    alive,
    job_ids,
    lost_locks,
    lowest_pttl,
    take_locks,
    wait_for,
    wait_ticks,
    watch_locks,
)

if TYPE_CHECKING:
    from tests.faults.conftest import FaultRecord
    from tests.faults.proxy import FaultProxy, Mode
    from tests.support import Recorder


@pytest.mark.parametrize("mode", ["blackhole", "reset"])
def test_outage_shorter_than_ttl_loses_nothing_and_the_first_tick_after_renews(
    mode: Mode, proxy: FaultProxy, direct: redis.Redis, reports: Recorder, record: FaultRecord
) -> None:
    # Given 20 locks of 4 s, renewed through the proxy (1 s ticks, 1.25 s per attempt)
    lock_ms = 4000
    timing = Timing(lock_ms)
    manager, jobs = start_tracking(proxy.url, direct, reports, lock_ms)
    record.fault = f"{mode} shorter than the TTL" if mode == "blackhole" else "connection resets"
    record.asserted = (
        "no lock lost, no failure reported; a reset's ticks report on_error; renewed at once after"
    )

    # When the network fails for 0.7 of the TTL, right after a renewal
    since = time.monotonic()
    reports.wait_renewed(jobs, first_round_s(lock_ms), since=since)
    outage_started = time.monotonic()
    proxy.mode = mode
    time.sleep(0.7 * lock_ms / 1000)
    lowest_ttl = lowest_pttl(direct, KEYS, jobs)
    proxy.passthrough()
    recovered = time.monotonic()

    # Then every job is renewed again at once: a renewal sent into the black
    # hole is answered as it heals, a reset one is retried within milliseconds
    reports.wait_renewed(jobs, 2 * timing.interval / 1000 + 3, since=recovered)
    stats = get_stats(manager, timeout=10)
    record.locks_lost = len(lost_locks(direct, KEYS, jobs))
    record.count_reports(reports)
    errors = reports.errors(since=outage_started)
    record.notes = {
        "outage_s": round(recovered - outage_started, 2),
        "lowest_ttl_ms": lowest_ttl,
        "errors": [type(exc).__name__ for exc in errors],
    }
    # And nothing was lost or reported lost, and the manager still answers
    assert record.locks_lost == 0
    assert record.false_reports == 0
    assert stats.lost == 0
    assert lowest_ttl > 0
    if mode == "reset":
        assert errors
    assert all(isinstance(exc, (redis.ConnectionError, redis.TimeoutError)) for exc in errors)
    assert get_active_job_count(manager, timeout=5) == JOBS


def test_blackhole_longer_than_ttl_reports_every_expired_lock_exactly_once(
    proxy: FaultProxy, direct: redis.Redis, reports: Recorder, record: FaultRecord
) -> None:
    # Given 20 locks of 2 s renewed through the proxy
    lock_ms = 2000
    manager, jobs = start_tracking(proxy.url, direct, reports, lock_ms)
    record.fault = "blackhole longer than the TTL"
    record.asserted = "every expired or stolen lock reported exactly once, then untracked"

    # When the network is dark until every lock has expired, and meanwhile
    # another worker takes over five of the jobs
    proxy.blackhole()
    stolen = dict(list(jobs.items())[:5])
    for job_id in stolen:
        direct.set(KEYS.lock(job_id), "other-worker", px=60_000)
    expiring = {job_id: token for job_id, token in jobs.items() if job_id not in stolen}
    wait_for(
        lambda: not alive(direct, KEYS, expiring),
        lock_ms / 1000 + 5,
        "the locks to expire during the black-hole",
    )
    proxy.passthrough()

    # Then every job is reported lost once, with why, and no later tick reports it again
    reports.wait(
        lambda: len(reports.lost()) >= JOBS,
        timeout=first_round_s(lock_ms),
        what="the lost locks to be reported",
    )
    wait_ticks(manager, 3, first_round_s(lock_ms))
    record.count_reports(reports, lost=jobs)
    record.notes = {"reported": len(reports.lost())}
    assert reports.lost_counts() == dict.fromkeys(jobs, 1)
    assert {lost.job_id: lost.reason for lost in reports.lost()} == {
        **dict.fromkeys(expiring, "expired"),
        **dict.fromkeys(stolen, "stolen"),
    }
    assert get_active_job_count(manager, timeout=5) == 0
    assert get_stats(manager, timeout=5).lost == JOBS
    # And the other worker's locks were not touched
    assert [direct.get(KEYS.lock(job_id)) for job_id in stolen] == [b"other-worker"] * 5

    # And a job tracked after recovery is renewed
    track_fresh(manager, direct, reports, lock_ms, 1)


def test_200ms_latency_per_round_trip_renews_every_lock_in_time(
    proxy: FaultProxy, direct: redis.Redis, reports: Recorder, record: FaultRecord
) -> None:
    # Given a caller-built client whose socket timeout allows for a slow link
    lock_ms = 2000
    timing = Timing(lock_ms)
    client = redis.Redis.from_url(proxy.url, socket_timeout=2.0, socket_connect_timeout=2.0)
    record.fault = "200 ms latency per round trip"
    record.asserted = "every lock renewed in time, no error, no failure"

    manager, jobs = start_tracking(client, direct, reports, lock_ms)

    # When every round trip takes 200 ms longer for four renewal rounds
    proxy.latency = 0.2
    started = time.monotonic()
    seen = watch_locks(direct, KEYS, jobs, 4 * timing.renew_time / 1000, every=0.1)

    # Then no lock came near expiry, and every tick paid the latency
    stats = get_stats(manager, timeout=5)
    record.locks_lost = len(seen.missing)
    record.count_reports(reports)
    record.notes = {"lowest_ttl_ms": seen.lowest_pttl, "max_tick_ms": round(stats.max_tick_ms)}
    assert record.locks_lost == 0
    assert record.false_reports == 0
    assert stats.errors == 0
    assert stats.max_tick_ms >= 200
    assert seen.lowest_pttl is not None and seen.lowest_pttl > 0
    assert set(reports.renewed(since=started)) == set(jobs)
    client.close()


#: Partitions as a share of the TTL; ``PARTITION_RUNS`` repeats each (``make faults``: 4).
PARTITIONS = [0.5, 0.6, 0.7, 0.8, 0.9]


@pytest.mark.parametrize("heal", ["buffered", "dead"])
@pytest.mark.parametrize(
    "share",
    [
        pytest.param(share, id=f"{share}-run{run}")
        for run in range(int(os.environ.get("PARTITION_RUNS", "1")))
        for share in PARTITIONS
    ],
)
def test_a_partition_that_heals_before_the_ttl_loses_no_lock(
    share: float,
    heal: str,
    proxy: FaultProxy,
    direct: redis.Redis,
    reports: Recorder,
    record: FaultRecord,
) -> None:
    # Given 4 locks of 1,500 ms (375 ms ticks) renewed with the user's own
    # client: a 250 ms socket timeout and no retry
    lock_ms, count = 1500, 4
    timing = Timing(lock_ms)
    client = redis.Redis.from_url(
        proxy.url, socket_timeout=0.25, socket_connect_timeout=0.25, retry=Retry(NoBackoff(), 0)
    )
    record.fault = "black-hole partition of 0.5-0.9 of the TTL" + (
        ", its connections dead after" if heal == "dead" else ""
    )
    record.asserted = "no lock lost, none reported; renewed again soon after the heal"
    jobs = take_locks(direct, KEYS, job_ids(count), lock_ms)
    manager = start_link(connection=client, keys=KEYS, lock_duration=lock_ms, **reports.callbacks())
    for job_id, token in jobs.items():
        track_job(manager, job_id, token)
    reports.wait_renewed(jobs, first_round_s(lock_ms))
    # When the network goes dark right after a renewal of every lock, for a
    # share of the TTL that leaves at least a round trip before it runs out
    since = time.monotonic()
    reports.wait_renewed(jobs, first_round_s(lock_ms), since=since)
    renewed_at = time.monotonic()
    proxy.blackhole()
    time.sleep(max(0.0, renewed_at + share * lock_ms / 1000 - time.monotonic()))
    if heal == "dead":
        # As after a router's restart: what was open answers with a reset.
        proxy.reset()
    proxy.passthrough()
    healed = time.monotonic()
    # Then every lock is renewed again before its TTL runs out
    reports.wait(
        lambda: reports.renewed(since=healed), 2 * timing.renew_time / 1000 + 3, "a renewal"
    )
    first = time.monotonic()
    reports.wait_renewed(jobs, 2 * timing.renew_time / 1000 + 3, since=healed)
    record.locks_lost = len(lost_locks(direct, KEYS, jobs))
    record.count_reports(reports)
    record.notes = {
        "partition_ms": round((healed - renewed_at) * 1000),
        "renewed_after_heal_ms": round((first - healed) * 1000, 1),
    }
    stop(manager)
    client.close()
    assert record.locks_lost == 0
    assert record.false_reports == 0
