"""The metric instruments, read with the SDK's in-memory reader and scraped over loopback.

Against the real server. The ticks are sent by the test on a test-driven clock
(as in ``test_observability``), so each count is exact when the test looks.
"""

from __future__ import annotations

import urllib.request
from typing import TYPE_CHECKING, Any

import pytest
import redis

from actors import get_stats, start_link, stop, telemetry, track_job
from tests.integration.conftest import LOCK_DURATION, THRESHOLD, hold, on_a_dead_server, queue_keys
from tests.support import ManualClock, settle, take_locks, tick, wait_for
from tests.support.metering import metric_points, sdk_metering

if TYPE_CHECKING:
    from tests.conftest import Server, StartManager

WAIT_S = 20.0


def points(name: str, queue: str) -> list[Any]:
    """The data points of instrument ``name`` for ``queue``, as the SDK reads them now."""
    return metric_points(sdk_metering(), name, queue)


def total(name: str, queue: str) -> dict[str, float]:
    """A counter's value for ``queue``, by loss reason (``""`` where there is none)."""
    return {
        str((p.attributes or {}).get(telemetry.ATTR_REASON, "")): p.value
        for p in points(name, queue)
    }


def test_renewals_losses_by_reason_tick_duration_margin_and_tracked(
    redis_client: redis.Redis, start_manual: StartManager
) -> None:
    sdk_metering()
    # Given five held jobs, two of which lose their lock before the first renewing tick
    keys, clock = queue_keys(), ManualClock()
    manager = start_manual(redis_client, keys, clock)
    for job_id in ["j1", "j2", "j3", "j4", "j5"]:
        track_job(manager, job_id, hold(redis_client, keys, job_id))
    redis_client.delete(keys.lock("j2"))
    redis_client.set(keys.lock("j4"), "another-worker", px=20000)
    clock.advance(THRESHOLD + 1)

    # When the tick renews them
    tick(manager)

    # Then three renewals and two losses, one per reason, are counted for the queue
    name = keys.name
    assert total(telemetry.METRIC_RENEWALS, name) == {"": 3}
    assert total(telemetry.METRIC_LOSSES, name) == {"expired": 1, "stolen": 1}
    assert total(telemetry.METRIC_FAILED_TICKS, name) == {}
    # ...one tick's duration, as long as the stats say, in seconds
    (duration,) = points(telemetry.METRIC_TICK_DURATION, name)
    stats = get_stats(manager, timeout=10)
    assert duration.count == 1
    assert duration.sum == pytest.approx(stats.last_tick_ms / 1000)
    # ...the least margin of the tick, in seconds
    (margin,) = points(telemetry.METRIC_MARGIN, name)
    assert (margin.count, margin.sum) == (1, (LOCK_DURATION - (THRESHOLD + 1)) / 1000)
    # ...and the gauge reads the three locks still tracked
    assert [p.value for p in points(telemetry.METRIC_TRACKED, name)] == [3]

    # When the manager stops, it leaves the gauge
    stop(manager)
    assert [p.value for p in points(telemetry.METRIC_TRACKED, name)] == []


def test_a_counter_appears_at_its_first_event_and_the_gauge_with_the_manager(
    redis_client: redis.Redis, start_manual: StartManager
) -> None:
    metering = sdk_metering()
    keys, clock = queue_keys(), ManualClock()
    name = keys.name
    # Given a manager, whose gauge reads 0 from its start, that tracks one job and has
    # renewed nothing yet
    manager = start_manual(redis_client, keys, clock)
    settle(manager)
    assert [p.value for p in points(telemetry.METRIC_TRACKED, name)] == [0]
    track_job(manager, "f1", hold(redis_client, keys, "f1"))
    settle(manager)

    # Then the gauge reads it, and no counter or histogram has a point for the queue
    assert [p.value for p in points(telemetry.METRIC_TRACKED, name)] == [1]
    for instrument in (
        telemetry.METRIC_RENEWALS,
        telemetry.METRIC_LOSSES,
        telemetry.METRIC_FAILED_TICKS,
        telemetry.METRIC_TICK_DURATION,
        telemetry.METRIC_MARGIN,
    ):
        assert points(instrument, name) == [], instrument

    # When the first renewing tick renews the lock
    clock.advance(THRESHOLD + 1)
    tick(manager)

    # Then the renewals counter appears, born at that first renewal's count; the losses and
    # failed ticks counters still have no point: not a zero, nothing
    assert total(telemetry.METRIC_RENEWALS, name) == {"": 1}
    assert total(telemetry.METRIC_LOSSES, name) == {}
    assert total(telemetry.METRIC_FAILED_TICKS, name) == {}
    # ...and a Prometheus scrape has a renewals series for the queue and no losses series
    with urllib.request.urlopen(metering.scrape_url, timeout=10) as answer:
        scraped = [line for line in answer.read().decode().splitlines() if name in line]
    assert any(line.startswith("echomq_lock_renewals_total{") for line in scraped), scraped
    assert not any(line.startswith("echomq_lock_losses_total{") for line in scraped), scraped


def test_a_failed_tick_is_counted_and_keeps_every_lock(start_manual: StartManager) -> None:
    sdk_metering()
    keys, manager = on_a_dead_server(start_manual, "j1")

    tick(manager)
    tick(manager)

    assert total(telemetry.METRIC_FAILED_TICKS, keys.name) == {"": 2}
    assert total(telemetry.METRIC_LOSSES, keys.name) == {}
    assert [p.value for p in points(telemetry.METRIC_TRACKED, keys.name)] == [1]


def test_process_mode_counts_the_childs_renewals_in_the_worker(
    server: Server, redis_client: redis.Redis
) -> None:
    sdk_metering()
    keys = queue_keys()
    manager = start_link(connection=server.url, keys=keys, lock_duration=1000, isolation="process")
    try:
        tokens = take_locks(redis_client, keys, ["p1", "p2"], 1000)
        for job_id, token in tokens.items():
            track_job(manager, job_id, token)
        wait_for(
            lambda: total(telemetry.METRIC_RENEWALS, keys.name).get("", 0) >= 4,
            WAIT_S,
            "two renewals of each lock",
        )
        assert [p.value for p in points(telemetry.METRIC_TRACKED, keys.name)] == [2]
        assert points(telemetry.METRIC_TICK_DURATION, keys.name)[0].count >= 2
    finally:
        stop(manager)


def test_prometheus_scrape_over_loopback(
    redis_client: redis.Redis, start_manual: StartManager
) -> None:
    metering = sdk_metering()
    keys, clock = queue_keys(), ManualClock()
    manager = start_manual(redis_client, keys, clock)
    for job_id in ["s1", "s2"]:
        track_job(manager, job_id, hold(redis_client, keys, job_id))
    redis_client.delete(keys.lock("s2"))
    clock.advance(THRESHOLD + 1)
    tick(manager)

    with urllib.request.urlopen(metering.scrape_url, timeout=10) as answer:
        assert answer.status == 200
        text = answer.read().decode()
    label = f'bullmq_queue_name="{keys.name}"'
    lines = [line for line in text.splitlines() if label in line]

    def value(prefix: str, *labels: str) -> float:
        (line,) = [
            line
            for line in lines
            if line.startswith(prefix + "{") and all(extra in line for extra in labels)
        ]
        return float(line.rsplit(" ", 1)[1])

    assert value("echomq_lock_renewals_total") == 1.0
    assert value("echomq_lock_losses_total", 'echomq_lock_reason="expired"') == 1.0
    assert value("echomq_lock_tracked") == 1.0
    assert value("echomq_lock_tick_duration_seconds_count") == 1.0
    assert value("echomq_lock_margin_seconds_count") == 1.0
