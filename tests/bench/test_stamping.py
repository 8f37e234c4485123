"""How often locks are renewed, and how soon a new job's first renewal comes, against the baseline.

The safety rule needs one renewal per job per ``lock_renew_time``: no fewer (a
lock would outlive its renew window) and no more (every extra one is server
time). Both benchmarks here run the manager as it is (its own timer, grid
stamps, ``track_job`` stamped with the caller's clock) beside the baseline, the
way before (a tick selects and stamps with the clock read when it runs, a
tracked job is stamped when the manager handles it), rebuilt from public seams
in :mod:`tests.bench.stamping`. Both run on the real server with real locks and
real time, in the same run, in a seeded random order; machines are noisy, so
the tables give ratios and spreads rather than lone times.

- Renewal rate: N jobs renewed for ``RATE_WINDOWS`` renew windows, with and
  without two CPU-bound Python threads in the process; renewals per job per
  renew window (ideal 1.00) and the server's script time per job-hour, from
  INFO commandstats, read between ticks.
- First renewal behind a big tick: ``DELAY_JOBS`` jobs due in one tick, and a
  worker that calls ``track_job`` just as that tick's batch goes out; the times
  from its call to the grid time of the tick that renews its job, to that
  tick's batch, and to ``on_locks_renewed`` with its job, on the worker's clock.

Knobs: ``ACTORS_BENCH_RATE_SIZES=1000,10000``, ``ACTORS_BENCH_RATE_WINDOWS=8``,
``ACTORS_BENCH_DELAY_JOBS=100000``, ``ACTORS_BENCH_DELAY_TRIALS=3``.
"""

from __future__ import annotations

import math
import os
import random
import statistics
import threading
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest
import redis

from actors import (
    ExtendLocks,
    ManualTimer,
    QueueKeys,
    RedisRenewer,
    Timing,
    get_active_job_count,
    get_stats,
    start_link,
    stop,
    track_job,
)
from actors.timing import default_safety_margin, monotonic_ms
from tests.bench.conftest import ASK_TIMEOUT, SEED, env_ints, markdown_table
from tests.bench.stamping import (
    BASELINE,
    NEW,
    Locks,
    TickLog,
    WatchedRenewer,
    Way,
    cpu_bound_threads,
    make_timer,
    now_ms,
    script_usec,
    track_ts,
)
from tests.support import ManualClock

if TYPE_CHECKING:
    from tests.bench.conftest import BenchServer, Report

pytestmark = pytest.mark.bench


#: Socket timeout of the managers' clients, in seconds: a 100,000-job round
#: trip must never time out here (the timeout rule is not what is measured).
CLIENT_TIMEOUT = 30.0

#: Tracked jobs in the renewal-rate runs.
RATE_SIZES = env_ints("ACTORS_BENCH_RATE_SIZES", "1000,10000")
#: Renew windows measured per run, after the warm-up.
RATE_WINDOWS = int(os.environ.get("ACTORS_BENCH_RATE_WINDOWS", "8"))
#: Lock TTL in the rate runs, in ms: a 2 s renew window, a 1 s timer interval.
#: With two CPU-bound threads a 10,000-job tick takes about half a second on
#: 2 cores (every socket read waits for the GIL behind them), and a loaded
#: machine can double that: a 2,000 ms TTL then lost locks.
RATE_LOCK_DURATION = 4000
#: Timer ticks before the measurement: every job renewed once, the rhythm settled.
RATE_WARMUP_TICKS = 3
#: CPU-bound Python threads in the busy runs.
BUSY_THREADS = 2
RATE_KEYS = QueueKeys("rate", prefix="bull")

#: Jobs due in the big tick of the first-renewal benchmark.
DELAY_JOBS = int(os.environ.get("ACTORS_BENCH_DELAY_JOBS", "100000"))
#: Trials of each way in the first-renewal benchmark.
DELAY_TRIALS = int(os.environ.get("ACTORS_BENCH_DELAY_TRIALS", "3"))
#: ``lock_renew_time`` as a multiple of the big tick measured by hand. The
#: tick then outlasts the timer interval (half of it), the one case where a
#: stamp taken when the manager handles ``track_job`` delays the job's first
#: renewal; and it mostly ends within ``lock_renew_time`` (a tick that runs
#: longer delays the next, which the table shows; the grid time the job is
#: due at stays the same unless the tick runs past 1.5 windows). The trials'
#: ticks ran from 0.85 to 1.3 times the one measured by hand on a busy 2-core
#: machine. (With the default 15 s window a 100,000-job tick is far shorter
#: than the interval, and both ways renew the job at the same tick.)
DELAY_RENEW_PER_TICK = 1.4
#: Big ticks before the measured one (see :class:`~tests.bench.stamping.WatchedRenewer`).
DELAY_WARMUP_TICKS = 2
DELAY_KEYS = QueueKeys("delay", prefix="bull")
WORKER_JOB = "worker:job"


# -- renewal rate ------------------------------------------------------------


@dataclass(frozen=True)
class RateRun:
    """One run of one way at one size and load."""

    #: Renewals per job per renew window, over the whole measurement.
    rate: float
    #: Renewals per job in each whole renew window measured.
    per_window: list[float]
    #: Server script time per tracked job-hour, in milliseconds.
    script_ms_per_job_hour: float
    #: Server script time per renewal, in microseconds.
    script_us_per_renewal: float
    #: The manager's latest timer tick, in ms (grid-stamped ticks only).
    max_lateness_ms: float
    #: The manager's longest renewing tick, in ms.
    max_tick_ms: float


def measure_rate(url: str, admin: redis.Redis, size: int, way: Way, busy: int) -> RateRun:
    """Track ``size`` jobs with real locks and count their renewals for ``RATE_WINDOWS`` windows."""
    timing = Timing(RATE_LOCK_DURATION)
    ids = [f"rate:{i:06d}" for i in range(size)]
    tokens = [str(uuid.uuid4()) for _ in ids]
    admin.flushall()
    # A long first TTL: the first renewal comes up to two intervals after tracking.
    Locks(RATE_KEYS, ids, tokens, ttl_ms=60_000).reset(admin)
    log = TickLog()
    timer = make_timer(way, log, timing.interval)
    wait = (RATE_WARMUP_TICKS + 2 * RATE_WINDOWS + 2) * timing.interval / 1000 * 3 + 30
    client = redis.Redis.from_url(url, socket_timeout=CLIENT_TIMEOUT)
    with cpu_bound_threads(busy) as loops:
        manager = start_link(
            connection=client,
            keys=RATE_KEYS,
            lock_duration=RATE_LOCK_DURATION,
            on_locks_renewed=lambda renewed: log.add(len(renewed)),
            timer=timer.attach,
        )
        try:
            timer.release(manager)
            ts = track_ts(way)
            for job_id, token in zip(ids, tokens, strict=True):
                track_job(manager, job_id, token, ts=ts)
            log.wait_done(RATE_WARMUP_TICKS, wait)
            first, used_before = log.between_ticks(lambda: script_usec(admin), wait)
            log.wait_done(first + 2 * RATE_WINDOWS, wait)
            last, used_after = log.between_ticks(lambda: script_usec(admin), wait)
            stats = get_stats(manager, timeout=ASK_TIMEOUT)
        finally:
            stop(manager, timeout=ASK_TIMEOUT)
            client.close()
    assert busy == 0 or min(loops) > 0, "a CPU-bound thread never ran"
    assert stats.lost == 0, f"{stats.lost} lock(s) lost: the run measured nothing"
    assert stats.errors == 0, f"{stats.errors} tick(s) failed: the run measured nothing"
    # Each timer tick stands for one interval of its grid (a skipped grid
    # time, after a tick that overran, lengthens the span it covers).
    span_ms = log.scheduled[last - 1] + timing.interval - log.scheduled[first]
    renewals = sum(log.renewed[first:last])
    pairs = (last - first) // 2
    return RateRun(
        rate=renewals / size / (span_ms / timing.renew_time),
        per_window=[
            sum(log.renewed[first + 2 * w : first + 2 * w + 2]) / size for w in range(pairs)
        ],
        script_ms_per_job_hour=(used_after - used_before) / 1000 / size / (span_ms / 3_600_000),
        script_us_per_renewal=(used_after - used_before) / renewals,
        max_lateness_ms=stats.max_tick_lateness_ms,
        max_tick_ms=stats.max_tick_ms,
    )


def _spread(values: list[float]) -> str:
    return f"{min(values):.2f} to {max(values):.2f}"


def test_renewals_per_job_per_renew_window(
    bench_server: BenchServer, admin: redis.Redis, report: Report
) -> None:
    # Given N jobs with real locks, tracked by a manager of each way, idle or busy
    rng = random.Random(SEED + 3)
    runs: dict[tuple[int, int, Way], RateRun] = {}
    for size in RATE_SIZES:
        for busy in (0, BUSY_THREADS):
            order: list[Way] = [NEW, BASELINE]
            rng.shuffle(order)
            # When each renews them for RATE_WINDOWS renew windows
            for way in order:
                runs[size, busy, way] = measure_rate(bench_server.url, admin, size, way, busy)

    # Then the manager renews each lock once per window, and the report shows the baseline
    timing = Timing(RATE_LOCK_DURATION)
    rows = []
    for size in RATE_SIZES:
        for busy in (0, BUSY_THREADS):
            new, old = runs[size, busy, NEW], runs[size, busy, BASELINE]
            rows.append(
                [
                    f"{size:,}",
                    "idle" if busy == 0 else f"{busy} CPU-bound threads",
                    f"{new.rate:.3f}",
                    _spread(new.per_window),
                    f"{old.rate:.3f}",
                    _spread(old.per_window),
                    f"{new.rate / old.rate:.2f}x",
                    f"{new.script_ms_per_job_hour:.1f} ({new.script_us_per_renewal:.1f} µs)",
                    f"{old.script_ms_per_job_hour:.1f} ({old.script_us_per_renewal:.1f} µs)",
                    f"{new.script_ms_per_job_hour / old.script_ms_per_job_hour:.2f}x",
                    f"{new.max_lateness_ms:.0f} / {new.max_tick_ms:.0f}",
                ]
            )
    report.section(
        f"### Renewals per job per renew window (lock_duration {RATE_LOCK_DURATION:,} ms, "
        f"lock_renew_time {timing.renew_time:,} ms, {RATE_WINDOWS} windows per run)\n\n"
        + markdown_table(
            [
                "jobs",
                "process",
                "renewals/job/window: now",
                "per window",
                "baseline",
                "per window",
                "now / baseline",
                "script ms per job-hour (per renewal): now",
                "baseline",
                "now / baseline",
                "latest / longest tick (ms): now",
            ],
            rows,
        )
        + "\nIdeal: 1.00. Baseline: ticks select and stamp with the clock read when they run, "
        "tracks are stamped when handled. Per window: the least and the most renewals per job "
        "in one window of the run. Script time is the server's EVALSHA time at this "
        f"{timing.renew_time / 1000:g} s renew window (at the default 15 s it is "
        f"{15_000 / timing.renew_time:g} times less); it counts the server's own stalls too, so "
        "the time per renewal shows how much of a difference is noise.\n"
    )
    checks = [
        report.check(
            f"renewals per job per window, {size:,} jobs, "
            + ("idle" if busy == 0 else f"{busy} busy threads"),
            runs[size, busy, NEW].rate,
            1.02,
            "",
            at_most=True,
        )
        for size in RATE_SIZES
        for busy in (0, BUSY_THREADS)
    ]
    assert all(checks), "locks were renewed more than once per renew window: see the report"


# -- first renewal behind a big tick ----------------------------------------


def big_tick_seconds(url: str, ids: list[str], tokens: list[str]) -> float:
    """The median of three full ticks renewing every job, driven by hand."""
    client = redis.Redis.from_url(url, socket_timeout=CLIENT_TIMEOUT)
    clock = ManualClock()
    manager = start_link(connection=client, keys=DELAY_KEYS, clock=clock, timer=ManualTimer)
    seconds = []
    try:
        for job_id, token in zip(ids, tokens, strict=True):
            track_job(manager, job_id, token)
        get_active_job_count(manager, timeout=ASK_TIMEOUT)
        for _ in range(3):
            clock.now += 3_600_000
            started = time.perf_counter()
            manager.ask(ExtendLocks(), timeout=ASK_TIMEOUT)
            seconds.append(time.perf_counter() - started)
        assert get_stats(manager, timeout=ASK_TIMEOUT).renewed == 3 * len(ids)
    finally:
        stop(manager, timeout=ASK_TIMEOUT)
        client.close()
    return statistics.median(seconds)


@dataclass(frozen=True)
class DelayTrial:
    """One worker's ``track_job`` during a big tick, and its job's first renewal."""

    #: From ``track_job`` to the grid time of the tick that renews the job, in ms.
    to_grid_ms: float
    #: From ``track_job`` to that tick's batch going out, in ms.
    to_batch_ms: float
    #: From ``track_job`` to the server setting the job's lock's TTL, as a
    #: client polling it saw, in ms.
    to_server_ms: float
    #: From ``track_job`` to ``on_locks_renewed`` with the job, in ms.
    to_renewal_ms: float
    #: Jobs in the batch that renewed it.
    batch: int
    #: The big tick ``track_job`` was called during, from its batch to its
    #: ``on_locks_renewed``, in ms.
    tick_ms: float
    #: Whether that tick ended after its grid time plus ``lock_renew_time``:
    #: the manager was then busy for a whole window, and no stamp could help.
    overran: bool


class RenewalSampler:
    """Polls one lock's TTL from a thread of its own until a renewal sets it.

    The lock starts with a TTL far above ``lock_duration``; the first poll
    that reads ``lock_duration`` or less saw the renewal. The server serves
    this client between two script calls of a batch, so the poll sees the
    renewal when it happened, not when the whole batch's answer came back.
    """

    def __init__(self, url: str, key: str, lock_duration: int) -> None:
        self._client = redis.Redis.from_url(url, socket_timeout=CLIENT_TIMEOUT)
        self._key = key
        self._lock_duration = lock_duration
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="renewal-sampler", daemon=True)
        #: When a poll first saw the renewal, on :func:`now_ms`'s clock.
        self.renewed_at: float | None = None

    def start(self) -> None:
        """Start polling."""
        self._thread.start()

    def stop(self) -> None:
        """Stop polling and close the client."""
        self._done.set()
        if self._thread.is_alive():
            self._thread.join()
        self._client.close()

    def _poll(self) -> None:
        while not self._done.is_set():
            ttl = int(self._client.pttl(self._key))
            if 0 < ttl <= self._lock_duration:
                # The reply left the server before now: the renewal ran no later.
                self.renewed_at = now_ms()
                return
            self._done.wait(0.001)


def first_renewal_trial(
    url: str, ids: list[str], tokens: list[str], way: Way, timing: Timing
) -> DelayTrial:
    """Track ``ids``, all due at one tick; during a later such tick, track the worker's job."""
    log = TickLog()
    client = redis.Redis.from_url(url, socket_timeout=CLIENT_TIMEOUT)
    inner = RedisRenewer(client, DELAY_KEYS, timing, default_safety_margin(timing))
    # The first big ticks are the warm-up: the first waits for the tracking,
    # so it runs late, and the next may catch up; the one measured is on time.
    renewer = WatchedRenewer(
        inner,
        log,
        big=len(ids),
        watched=WORKER_JOB,
        warmup=DELAY_WARMUP_TICKS,
        on_time_ms=timing.interval / 2,
    )
    tracked = threading.Event()
    renewed = threading.Event()
    renewed_at: list[float] = []
    big_end: list[float] = []

    def on_renewed(job_ids: list[str]) -> None:
        at = now_ms()
        log.add(len(job_ids))
        if renewer.picked.is_set() and not big_end:
            big_end.append(at)
        if tracked.is_set() and not renewed_at and WORKER_JOB in job_ids:
            renewed_at.append(at)
            renewed.set()

    sampler = RenewalSampler(url, DELAY_KEYS.lock(WORKER_JOB), timing.lock_duration)
    timer = make_timer(way, log, timing.interval)
    manager = start_link(
        renewer=renewer,
        keys=DELAY_KEYS,
        lock_duration=timing.lock_duration,
        lock_renew_time=timing.renew_time,
        on_locks_renewed=on_renewed,
        timer=timer.attach,
    )
    wait = 30 + 20 * timing.renew_time / 1000
    try:
        # The big batch: stamped a window ago, so all are due at the first
        # tick, which waits until they are all tracked.
        ts = monotonic_ms() - timing.renew_time
        for job_id, token in zip(ids, tokens, strict=True):
            track_job(manager, job_id, token, ts=ts)
        assert get_active_job_count(manager, timeout=ASK_TIMEOUT) == len(ids)
        timer.release(manager)
        assert renewer.picked.wait(wait), "no tick of the big batch started on time"
        called = now_ms()
        tracked.set()
        track_job(manager, WORKER_JOB, "worker-token", ts=track_ts(way))
        sampler.start()
        assert renewed.wait(wait), "the worker's job was never renewed"
        stats = get_stats(manager, timeout=ASK_TIMEOUT)
    finally:
        stop(manager, timeout=ASK_TIMEOUT)
        sampler.stop()
        client.close()
    assert sampler.renewed_at is not None, "no poll saw the worker's lock renewed"
    assert stats.lost == 0 and stats.errors == 0, f"lost {stats.lost}, errors {stats.errors}"
    assert renewer.watched_batch is not None
    batch_at, scheduled, batch = renewer.watched_batch
    picked_at, picked_grid = renewer.picked_at
    return DelayTrial(
        to_grid_ms=scheduled - called,
        to_batch_ms=batch_at - called,
        to_server_ms=sampler.renewed_at - called,
        to_renewal_ms=renewed_at[0] - called,
        batch=batch,
        tick_ms=big_end[0] - picked_at,
        overran=big_end[0] > picked_grid + timing.renew_time,
    )


def _ms_spread(values: list[float]) -> str:
    return f"{statistics.median(values):,.0f} ({min(values):,.0f} to {max(values):,.0f})"


def test_first_renewal_of_a_job_tracked_during_a_big_tick(
    bench_server: BenchServer, admin: redis.Redis, report: Report
) -> None:
    # Given DELAY_JOBS jobs with real locks, and a lock_renew_time sized to their tick
    ids = [f"job:{i:06d}" for i in range(DELAY_JOBS)]
    tokens = [str(uuid.uuid4()) for _ in ids]
    admin.flushall()
    locks = Locks(DELAY_KEYS, [*ids, WORKER_JOB], [*tokens, "worker-token"], ttl_ms=600_000)
    locks.reset(admin)
    tick_ms = big_tick_seconds(bench_server.url, ids, tokens) * 1000
    renew_time = max(200, math.ceil(DELAY_RENEW_PER_TICK * tick_ms / 100) * 100)
    timing = Timing(2 * renew_time, renew_time)

    # When a worker tracks a job just as the big tick's batch goes out, each way in turn
    rng = random.Random(SEED + 4)
    trials: dict[Way, list[DelayTrial]] = {NEW: [], BASELINE: []}
    for _ in range(DELAY_TRIALS):
        order: list[Way] = [NEW, BASELINE]
        rng.shuffle(order)
        for way in order:
            locks.reset(admin)
            trials[way].append(first_renewal_trial(bench_server.url, ids, tokens, way, timing))

    # Then the job is due within lock_renew_time of its track_job, and the report shows both
    def row(way: Way, label: str) -> list[str]:
        done = trials[way]
        return [
            label,
            _ms_spread([t.to_grid_ms for t in done]),
            _ms_spread([t.to_batch_ms for t in done]),
            _ms_spread([t.to_server_ms for t in done]),
            f"{statistics.median(t.to_server_ms for t in done) / renew_time:.2f}",
            _ms_spread([t.to_renewal_ms for t in done]),
            f"{statistics.median(t.batch for t in done):,.0f}",
            _ms_spread([t.tick_ms for t in done]),
        ]

    overran = sum(t.overran for way in (NEW, BASELINE) for t in trials[way])
    ratio = statistics.median(t.to_server_ms for t in trials[BASELINE]) / statistics.median(
        t.to_server_ms for t in trials[NEW]
    )
    report.section(
        f"### First renewal of a job tracked during a {DELAY_JOBS:,}-job tick "
        f"(median (min to max) of {DELAY_TRIALS} trials, ms on the worker's clock)\n\n"
        f"lock_renew_time {renew_time:,} ms = {DELAY_RENEW_PER_TICK:g} x the {tick_ms:,.0f} ms "
        f"the {DELAY_JOBS:,}-job tick took here (timer interval {timing.interval:,} ms, "
        f"lock_duration {timing.lock_duration:,} ms). The worker calls track_job as the "
        "tick's batch goes out; its message waits behind the tick.\n\n"
        + markdown_table(
            [
                "way",
                "track_job → due (grid time)",
                "→ its batch sent",
                "→ renewed at the server",
                "→ renewed, in lock_renew_time",
                "→ on_locks_renewed",
                "renewing batch",
                "the tick it waited behind",
            ],
            [
                row(NEW, "now: ts at the caller, grid stamps"),
                row(BASELINE, "baseline: stamped when handled"),
            ],
        )
        + f"\nBaseline / now, to the renewal at the server: {ratio:.2f}x. A lock not yet "
        "renewed goes first in its batch (both ways), so the server renews it right after the "
        "batch goes out; on_locks_renewed comes once the whole batch is done. From the grid "
        "time to the renewal at the server is the tick's own work on its whole batch "
        "(selecting and packing every due job before the one round trip). Trials whose big "
        "tick ran past its grid time plus lock_renew_time (the manager busy for a whole "
        f"window): {overran}.\n"
    )
    passed = report.check(
        f"track_job during a {DELAY_JOBS:,}-job tick → due (grid time), in lock_renew_time",
        max(t.to_grid_ms for t in trials[NEW]) / renew_time,
        1.0,
        "x",
        at_most=True,
    )
    assert passed, "a job tracked during a big tick came due too late: see the report"
