"""What a manager tells about itself: stats, log records and OpenTelemetry spans.

All against the real server. Most tests inject the manager's clock and send
its ticks with ``ask``, so each tick has finished (and its counters, records
and span exist) when the test looks; a few run the real timer end to end.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
import redis
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from redis.backoff import NoBackoff
from redis.retry import Retry

from actors import (
    GetStats,
    QueueKeys,
    Stats,
    Timing,
    get_stats,
    start_link,
    telemetry,
    track_job,
)
from actors.embedded import EmbeddedServer
from tests.integration.conftest import (
    LOCK_DURATION,
    THRESHOLD,
    dead_client,
    hold,
    on_a_dead_server,
    queue_keys,
)
from tests.support import (
    ManualClock,
    ManualTimers,
    new_token,
    settle,
    tick,
    wait_for,
)
from tests.support.metering import metric_points, sdk_metering
from tests.support.tracing import sdk_tracer_provider

if TYPE_CHECKING:
    from tests.conftest import Server, StartManager

#: Long enough for anything these tests wait for, in seconds.
WAIT_S = 20.0


# -- stats -----------------------------------------------------------------


def test_stats_count_ticks_renewals_losses_and_script_calls_exactly(
    redis_client: redis.Redis, start_manual: StartManager
) -> None:
    # Given five held jobs, tracked by a manager that sends two ids per script call
    keys, clock = queue_keys(), ManualClock()
    manager = start_manual(redis_client, keys, clock, max_batch=2)
    tokens = {job_id: hold(redis_client, keys, job_id) for job_id in ["j1", "j2", "j3", "j4", "j5"]}
    for job_id, held in tokens.items():
        track_job(manager, job_id, held)

    # When a tick finds nothing due yet
    tick(manager)

    # Then it counts as a tick and nothing else
    stats = get_stats(manager, timeout=10)
    assert stats == Stats(
        queue=keys.name,
        ticks=1,
        renewed=0,
        lost=0,
        errors=0,
        script_calls=0,
        tracked=5,
        last_batch=0,
        last_tick_ms=0.0,
        max_tick_ms=0.0,
        last_renewal_age_ms=None,
    )

    # When two locks are lost (one expired, one taken over) and the next tick renews all five
    redis_client.delete(keys.lock("j2"))
    redis_client.set(keys.lock("j4"), "another-worker", px=20000)
    clock.advance(THRESHOLD + 1)
    tick(manager)

    # Then three renewals, two losses and three script calls (2 + 2 + 1 ids) are counted
    stats = get_stats(manager, timeout=10)
    assert (stats.ticks, stats.renewed, stats.lost, stats.errors) == (2, 3, 2, 0)
    assert (stats.script_calls, stats.last_batch, stats.tracked) == (3, 5, 3)
    assert stats.renewing_ticks == 1  # the first found nothing due
    assert stats.last_renewal_age_ms == 0.0
    assert 0 < stats.last_tick_ms <= stats.max_tick_ms
    # ...the locks had all but the threshold left, and a tick asked for by hand is never late
    assert stats.min_lock_margin_ms == LOCK_DURATION - (THRESHOLD + 1)
    assert (stats.tick_lateness_ms, stats.max_tick_lateness_ms) == (0.0, 0.0)
    # ...and the server agrees: the renewed locks carry a fresh TTL
    for job_id in ["j1", "j3", "j5"]:
        assert redis_client.pttl(keys.lock(job_id)) > 25000

    # When time passes without a renewal
    clock.advance(1234)

    # Then the age of the last renewal grows with it, whichever way it is asked
    assert get_stats(manager, timeout=10).last_renewal_age_ms == 1234.0
    assert manager.ask(GetStats(), timeout=10) == get_stats(manager, timeout=10)
    assert manager.proxy().get_stats().get(timeout=10) == get_stats(manager, timeout=10)


def test_timer_ticks_count_their_lateness_and_keep_to_the_grid(
    redis_client: redis.Redis, start_manual: StartManager, timers: ManualTimers
) -> None:
    # Given a tracked job and a manager whose timer is armed for its first tick
    metering = sdk_metering()
    keys, clock = queue_keys(), ManualClock()
    manager = start_manual(redis_client, keys, clock)
    track_job(manager, "j1", hold(redis_client, keys, "j1"))
    settle(manager)
    first = timers.deadline

    # When that tick runs 250 ms after its grid time, and the next one on time
    clock.now = first + 250
    tick(manager, scheduled=first)
    late = get_stats(manager, timeout=10)
    second = timers.deadline
    clock.now = second
    tick(manager, scheduled=second)

    # Then the lateness is counted, the grid did not move, and the job was
    # renewed at the second tick with exactly the margin the timing promises
    stats = get_stats(manager, timeout=10)
    assert second - first == Timing(LOCK_DURATION).interval
    assert (late.tick_lateness_ms, late.max_tick_lateness_ms, late.renewed) == (250.0, 250.0, 0)
    assert (stats.tick_lateness_ms, stats.max_tick_lateness_ms, stats.renewed) == (0.0, 250.0, 1)
    assert stats.min_lock_margin_ms == Timing(LOCK_DURATION).headroom
    # ...and the lateness histogram has both ticks, in seconds
    (late_point,) = metric_points(metering, telemetry.METRIC_TICK_LATENESS, keys.name)
    assert (late_point.count, late_point.sum, late_point.max) == (2, 0.25, 0.25)


def test_failed_ticks_count_errors_and_keep_every_job(start_manual: StartManager) -> None:
    # Given two tracked jobs on a server nobody listens on
    keys, clock = queue_keys(), ManualClock()
    manager = start_manual(dead_client(), keys, clock)
    track_job(manager, "j1", new_token())
    track_job(manager, "j2", new_token())
    settle(manager)
    clock.advance(THRESHOLD + 1)

    # When two ticks in a row fail
    tick(manager)
    tick(manager)

    # Then both count as errors, both retried the same two jobs, nothing is lost
    stats = get_stats(manager, timeout=10)
    assert (stats.ticks, stats.errors, stats.renewed, stats.lost) == (2, 2, 0, 0)
    assert (stats.tracked, stats.last_batch, stats.script_calls) == (2, 2, 2)
    assert stats.renewing_ticks == 2
    assert stats.last_renewal_age_ms is None


def test_a_paused_server_counts_one_error_then_renewals_resume(start_manual: StartManager) -> None:
    # Given a private server holding a job's lock, and a client that gives up after 300 ms
    with EmbeddedServer() as private:
        client = redis.Redis.from_url(
            private.url, socket_timeout=0.3, socket_connect_timeout=0.3, retry=Retry(NoBackoff(), 0)
        )
        keys, clock = queue_keys(), ManualClock()
        token = hold(client, keys, "j1", ttl_ms=60000)
        manager = start_manual(client, keys, clock)
        track_job(manager, "j1", token)
        settle(manager)
        clock.advance(THRESHOLD + 1)

        # When the server hangs for one tick, then comes back for the next
        private.pause()
        try:
            tick(manager)
        finally:
            private.resume()
        after_fault = get_stats(manager, timeout=10)
        tick(manager)

        # Then exactly one error is counted, and the retry renews the job
        assert (after_fault.errors, after_fault.renewed, after_fault.tracked) == (1, 0, 1)
        stats = get_stats(manager, timeout=10)
        assert (stats.ticks, stats.errors, stats.renewed, stats.lost) == (2, 1, 1, 0)
        assert stats.last_renewal_age_ms == 0.0
        assert client.pttl(keys.lock("j1")) > 25000
        client.close()


def test_stats_follow_the_real_timer(server: Server, redis_client: redis.Redis) -> None:
    # Given a job held for 2 s and a manager renewing it on its own timer
    keys = queue_keys()
    token = hold(redis_client, keys, "j1", ttl_ms=2000)
    manager = start_link(connection=server.url, keys=keys, lock_duration=2000)
    track_job(manager, "j1", token)

    # When the timer has renewed it a few times, for longer than its first TTL
    started = time.monotonic()
    wait_for(lambda: get_stats(manager, timeout=10).renewed >= 3, WAIT_S, "three renewals")
    time.sleep(max(0.0, started + 2.5 - time.monotonic()))

    # Then the lock is still held, and the stats show a recent renewal and no fault
    assert redis_client.get(keys.lock("j1")) == token.encode()
    stats = get_stats(manager, timeout=10)
    assert stats.lost == 0
    assert stats.errors == 0
    assert stats.ticks >= stats.renewing_ticks == stats.script_calls >= 3
    assert stats.last_renewal_age_ms is not None
    assert stats.last_renewal_age_ms < 2000


# -- logging ---------------------------------------------------------------


def actors_records(caplog: pytest.LogCaptureFixture, level: int) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith("actors") and r.levelno >= level]


def test_healthy_ticks_log_nothing_at_info_or_above(
    server: Server, redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a manager renewing two held jobs on its own timer, every record captured
    caplog.set_level(logging.DEBUG, logger="actors")
    keys = queue_keys()
    manager = start_link(connection=server.url, keys=keys, lock_duration=2000)
    for job_id in ["j1", "j2"]:
        track_job(manager, job_id, hold(redis_client, keys, job_id, ttl_ms=2000))

    # When several ticks renew them
    wait_for(lambda: get_stats(manager, timeout=10).renewed >= 4, WAIT_S, "four renewals")

    # Then nothing was logged at INFO or above
    assert actors_records(caplog, logging.INFO) == []


def test_a_lost_lock_is_one_warning_naming_the_job_and_the_queue(
    server: Server,
    redis_client: redis.Redis,
    start_manual: StartManager,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Given two tracked jobs, one of which another worker has taken over
    caplog.set_level(logging.DEBUG, logger="actors")
    keys, clock = queue_keys(), ManualClock()
    manager = start_manual(server.url, keys, clock)
    track_job(manager, "kept", hold(redis_client, keys, "kept"))
    track_job(manager, "taken", hold(redis_client, keys, "taken"))
    redis_client.set(keys.lock("taken"), "another-worker", px=20000)
    settle(manager)
    clock.advance(THRESHOLD + 1)

    # When a tick renews them
    tick(manager)

    # Then one WARNING from the manager's logger names the lost job and the queue
    warnings = actors_records(caplog, logging.WARNING)
    assert len(warnings) == 1
    record = warnings[0]
    assert record.levelno == logging.WARNING
    assert record.name == "actors.lock_manager"
    assert "taken" in record.getMessage()
    assert "kept" not in record.getMessage()
    assert keys.name in record.getMessage()


def test_a_failed_tick_is_an_error_with_its_cause(
    start_manual: StartManager, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a tracked job on a server nobody listens on
    caplog.set_level(logging.DEBUG, logger="actors")
    keys, clock = queue_keys(), ManualClock()
    errors: list[Exception] = []
    manager = start_manual(dead_client(), keys, clock, on_error=errors.append)
    track_job(manager, "j1", new_token())
    settle(manager)
    clock.advance(THRESHOLD + 1)

    # When a tick fails
    tick(manager)

    # Then one ERROR names the queue and the cause, with its traceback, and on_error got it;
    # and one more line, the only other one, says which server it cannot reach.
    records = actors_records(caplog, logging.WARNING)
    (failure,) = [r for r in records if r.exc_info is not None]
    assert failure.levelno == logging.ERROR
    (unreachable,) = [r for r in records if r is not failure]
    assert keys.name in failure.getMessage()
    assert "ConnectionError" in failure.getMessage()
    assert isinstance(failure.exc_info[1], redis.ConnectionError)  # type: ignore[index]
    assert "cannot reach" in unreachable.getMessage()
    assert keys.name in unreachable.getMessage()
    assert len(errors) == 1
    assert isinstance(errors[0], redis.ConnectionError)

    # and a second failed tick logs its ERROR without a traceback, and names no server again.
    caplog.clear()
    clock.advance(THRESHOLD + 1)
    tick(manager)
    (again,) = actors_records(caplog, logging.WARNING)
    assert again.exc_info is None
    assert "cannot reach" not in again.getMessage()


# -- OpenTelemetry ---------------------------------------------------------


@pytest.fixture(scope="module")
def exporter() -> Iterator[InMemorySpanExporter]:
    """Every span the process ends, kept in memory for this module's tests."""
    memory = InMemorySpanExporter()
    sdk_tracer_provider().add_span_processor(SimpleSpanProcessor(memory))
    yield memory
    # The provider is process-wide and keeps its processors: stop storing.
    memory.shutdown()


def spans_of(exporter: InMemorySpanExporter, keys: QueueKeys) -> list[ReadableSpan]:
    return [
        span
        for span in exporter.get_finished_spans()
        if (span.attributes or {}).get(telemetry.ATTR_QUEUE) == keys.name
    ]


def test_one_span_per_renewing_tick_and_none_for_empty_ticks(
    redis_client: redis.Redis, start_manual: StartManager, exporter: InMemorySpanExporter
) -> None:
    # Given three tracked jobs, one of whose locks is gone, two ids per script call
    keys, clock = queue_keys(), ManualClock()
    manager = start_manual(redis_client, keys, clock, max_batch=2)
    for job_id in ["j1", "j2", "j3"]:
        track_job(manager, job_id, hold(redis_client, keys, job_id))
    redis_client.delete(keys.lock("j2"))

    # When a tick finds nothing due
    tick(manager)

    # Then it opens no span
    assert spans_of(exporter, keys) == []

    # When the next tick renews them
    settle(manager)
    clock.advance(THRESHOLD + 1)
    tick(manager)

    # Then exactly one span tells what it did, with BullMQ's names for queue and operation
    (span,) = spans_of(exporter, keys)
    assert span.name == "extend_locks"
    assert span.kind == SpanKind.INTERNAL
    assert dict(span.attributes or {}) == {
        "bullmq.queue.name": keys.name,
        "bullmq.queue.operation": "extendLocks",
        "echomq.lock.jobs": 3,
        "echomq.lock.failed": 1,
        "echomq.lock.failed_ids": ("j2",),
        "echomq.lock.script_calls": 2,
        "echomq.lock.tick_lateness_ms": 0.0,
        "echomq.lock.margin_ms": LOCK_DURATION - (THRESHOLD + 1),
    }
    assert span.status.status_code == StatusCode.UNSET

    # When one more tick renews the two jobs left
    settle(manager)
    clock.advance(THRESHOLD + 1)
    tick(manager)

    # Then it adds one more span, without a loss
    spans = spans_of(exporter, keys)
    assert len(spans) == 2
    assert (spans[1].attributes or {})["echomq.lock.jobs"] == 2
    assert (spans[1].attributes or {})["echomq.lock.failed"] == 0
    assert "echomq.lock.failed_ids" not in (spans[1].attributes or {})


def test_a_failed_tick_span_carries_the_error(
    start_manual: StartManager, exporter: InMemorySpanExporter
) -> None:
    # Given a tracked job on a server nobody listens on
    keys, manager = on_a_dead_server(start_manual, "j1")

    # When a tick fails
    tick(manager)

    # Then its span has an error status, the error's type and the exception event
    (span,) = spans_of(exporter, keys)
    assert span.status.status_code == StatusCode.ERROR
    assert "ConnectionError" in (span.status.description or "")
    assert (span.attributes or {})["error.type"] == "ConnectionError"
    assert (span.attributes or {})["echomq.lock.jobs"] == 1
    assert [event.name for event in span.events] == ["exception"]


# Acts as if opentelemetry were not installed, then renews one lock for real.
_WITHOUT_OPENTELEMETRY = r"""
import json, sys, time, uuid

class NoOpenTelemetry:
    def find_spec(self, name, path=None, target=None):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NoOpenTelemetry())
try:
    import opentelemetry
    blocked = False
except ModuleNotFoundError:
    blocked = True

import redis
from actors import QueueKeys, get_stats, start_link, stop, track_job

url, queue = sys.argv[1], sys.argv[2]
keys = QueueKeys(queue)
client = redis.Redis.from_url(url, socket_timeout=10)
token = str(uuid.uuid4())
client.set(keys.lock("j1"), token, px=2000)
manager = start_link(connection=url, keys=keys, lock_duration=2000)
track_job(manager, "j1", token)
deadline = time.monotonic() + 20
while get_stats(manager).renewed < 2 and time.monotonic() < deadline:
    time.sleep(0.02)
stats = get_stats(manager)
stop(manager)
print(json.dumps({
    "blocked": blocked,
    "renewed": stats.renewed,
    "errors": stats.errors,
    "holder": client.get(keys.lock("j1")).decode() == token,
    "loaded": sorted(m for m in sys.modules if m.split(".")[0] == "opentelemetry"),
}))
"""


def test_without_opentelemetry_renewal_works_and_imports_nothing(
    server: Server, redis_client: redis.Redis
) -> None:
    # Given a Python where opentelemetry cannot be imported
    keys = queue_keys()

    # When it renews a lock through the manager
    result = subprocess.run(
        [sys.executable, "-c", _WITHOUT_OPENTELEMETRY, server.url, keys.name],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    # Then the renewals happen, nothing was logged, and no opentelemetry module is loaded
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    outcome = json.loads(result.stdout)
    assert outcome == {
        "blocked": True,
        "renewed": outcome["renewed"],
        "errors": 0,
        "holder": True,
        "loaded": [],
    }
    assert outcome["renewed"] >= 2
