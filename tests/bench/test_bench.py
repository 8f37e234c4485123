"""Performance of lock renewal: the manager's tick against bare calls and BullMQ.

Run with ``make bench`` (``pytest -m bench -s -p no:randomly tests/bench``,
with :mod:`tests.bench.test_stamping`); it prints Markdown tables and a
PASS/FAIL line per target, and fails if a target is missed. It is sized for
a 2-core machine: about 9 minutes in all. ``ACTORS_ENGINE=redis`` runs it on
Redis 6.2 instead of Valkey 8.1. Knobs for a quick try:
``ACTORS_BENCH_SIZES=100,1000``, ``ACTORS_BENCH_ROUNDS=2`` and
``ACTORS_BENCH_CHUNK_ROUNDS=1``;
``ACTORS_BENCH_MAX_BATCH=250`` runs the main comparison with another
``max_batch``; ``ACTORS_BENCH_OUT=file.md`` also writes the report.

Every figure is a median over rounds. In each round the contenders run in a
random order (seeded), and before each one every lock is set again with a
fresh TTL and every id is put back in the stalled set, so each contender
finds the server in the same state. Ratios are taken per round, then their
median is reported; "server" is the time the server spent running the
contender's own script calls in that run (INFO commandstats, EVALSHA).

Contenders, all renewing the same N locks on the same server:

- tick: the manager's full tick, from the ``ExtendLocks`` message to the
  ``on_locks_renewed`` callback done (``ref.ask``), all N jobs due;
- tick, process mode: the same with ``isolation="process"``, the child's
  renewal and its report back to the worker included;
- floor: the tick's script calls packed beforehand and sent in one write,
  the replies read: the server's own work and one round trip;
- bare: the same script calls sent straight through redis-py (ids and tokens
  already in lists; packing and the round trip included);
- bullmq-py: the ``bullmq`` package's ``LockManager._extend_locks`` with every
  tracked id, on an asyncio loop, through its own Redis client (its
  selection pass is not timed, which favours it slightly);
- per-job: BullMQ's ``extendLock-2.lua`` once per job, all calls pipelined in
  one round trip, a lower bound for what one timer per job would cost (up to
  ``PER_JOB_MAX`` jobs: beyond, it alone would take a minute of the run).

The tick is driven by hand here: the manager gets a clock the benchmark moves
(``clock=``) and an :class:`actors.ManualTimer` (``timer=``), so every job is
due and no timer tick runs between rounds.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import os
import random
import statistics
import threading
import time
import tracemalloc
import uuid
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgpack
import pykka
import pytest
import redis
import redis.asyncio
from bullmq.backends.redis_backend import RedisBackend
from bullmq.lock_manager import LockManager as BullLockManager
from bullmq.redis_connection import RedisConnection

from actors import (
    ExtendLocks,
    ManualTimer,
    QueueKeys,
    TrackJob,
    UntrackJob,
    get_active_job_count,
    start_link,
    stop,
    track_job,
    untrack_job,
)
from actors.ref import ManagerRef
from actors.scripts import DEFAULT_MAX_BATCH, script_sha, script_source
from tests.bench.conftest import (
    ASK_TIMEOUT,
    SEED,
    SLOWLOG_LENGTH,
    SLOWLOG_THRESHOLD_US,
    env_ints,
    markdown_table,
)
from tests.isolation.conftest import children
from tests.support import ManualClock, PackedCommands, wait_for

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from tests.bench.conftest import BenchServer, Report

pytestmark = pytest.mark.bench


#: Numbers of due jobs per tick.
SIZES = env_ints("ACTORS_BENCH_SIZES", "100,1000,10000,100000")
#: Timed rounds at 100,000 jobs; each contender
#: runs once per round. Smaller sizes and the message rates are cheap and
#: noisier: they get three times as many.
ROUNDS = int(os.environ.get("ACTORS_BENCH_ROUNDS", "7"))
#: Timed rounds of the max_batch comparison (six managers of 100,000 jobs:
#: a minute of the run at three rounds; no target rests on it).
CHUNK_ROUNDS = int(os.environ.get("ACTORS_BENCH_CHUNK_ROUNDS", "3"))
#: ``max_batch`` of the manager and the bare calls in the main comparison.
MAX_BATCH = int(os.environ.get("ACTORS_BENCH_MAX_BATCH", str(DEFAULT_MAX_BATCH)))
#: ``max_batch`` values compared at the largest size (the last one: all ids in one call).
BATCHES = (250, 500, 1000, 2000, 5000, max(SIZES))
#: Most due jobs the per-job contender runs at (six times the tick's time).
PER_JOB_MAX = 10_000
#: Most a tick may take over the server's time running its scripts (INFO
#: commandstats, the same run) at 10,000 and 100,000 due jobs: a ratio per
#: round, then its median, as two runs a second apart on a shared machine
#: differ more than the client's share of one.
TICK_OVER_SCRIPTS = 1.05
#: The same for a process-mode manager's tick.
PROCESS_TICK_OVER_SCRIPTS = 1.10
#: Lock TTL set by every contender, in milliseconds.
LOCK_DURATION = 30_000
#: How far the manager's clock moves before a timed tick, in ms: every job is due.
ALL_DUE_MS = 10 * LOCK_DURATION
#: TTL for the managers that only track: long enough that no tick ever finds a job due.
QUIET_LOCK_DURATION = 3_600_000
#: Caller threads telling the messages of the messaging benchmark, in turn.
CALLERS = (1, 8)
#: Least track+untrack rate, as a share of a no-op pykka actor's tell rate.
TELL_RATE = 0.9
#: Least process-mode track+untrack rate, as a share of thread mode's (within 1.5x).
PROCESS_RATE = 1 / 1.5
#: Most bytes per tracked job, id and token strings included.
BYTES_PER_JOB = 253
#: Messages told per round in the messaging benchmark (half track, half untrack).
MESSAGES = 100_000
#: Jobs tracked for the memory measurement.
MEMORY_JOBS = 100_000
#: BullMQ keys, so the bullmq package and the manager renew the very same locks.
KEYS = QueueKeys("bench", prefix="bull")

#: BullMQ's one-job renewal script, as the bullmq package ships it.
PER_JOB_SCRIPT = resources.files("bullmq") / "commands" / "extendLock-2.lua"


class CountingConnection(redis.Connection):
    """A connection that counts its round trips: a write after a read starts one.

    A pipeline is one; so is a batch whose calls are each sent as soon as
    packed, all before the first reply is read.
    """

    round_trips = 0
    _read = True

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        if self._read:
            CountingConnection.round_trips += 1
            self._read = False
        super().send_packed_command(command, check_health)  # type: ignore[no-untyped-call]

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        self._read = True
        return super().read_response(*args, **kwargs)


class AsyncCountingConnection(redis.asyncio.Connection):
    """:class:`CountingConnection` for the asyncio client bullmq uses."""

    round_trips = 0
    _read = True

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        if self._read:
            AsyncCountingConnection.round_trips += 1
            self._read = False
        await super().send_packed_command(command, check_health)

    async def read_response(self, *args: Any, **kwargs: Any) -> Any:
        self._read = True
        return await super().read_response(*args, **kwargs)


def _reset_write_counts() -> None:
    CountingConnection.round_trips = 0
    AsyncCountingConnection.round_trips = 0


def _write_count() -> int:
    return CountingConnection.round_trips + AsyncCountingConnection.round_trips


def counting_client(url: str) -> redis.Redis:
    return redis.Redis.from_url(
        url, socket_timeout=ASK_TIMEOUT, connection_class=CountingConnection
    )


# -- the server's view -------------------------------------------------------


@dataclass(frozen=True)
class ServerCost:
    """What the server saw of one contender's run."""

    #: Script calls (EVAL/EVALSHA) it ran.
    script_calls: int
    #: Its longest script call in ms; ``None`` when none reached the slow log.
    longest_ms: float | None
    #: Median script call in ms, calls under the slow log threshold counted at it.
    median_ms: float | None
    #: The time the server spent running the scripts, in ms (INFO commandstats).
    script_ms: float


def _script_counters(admin: redis.Redis) -> tuple[int, int]:
    """Script calls (EVAL/EVALSHA) the server ran so far, and the microseconds they took."""
    stats = admin.info("commandstats")
    names = ("cmdstat_evalsha", "cmdstat_eval")
    return (
        sum(int(stats.get(name, {}).get("calls", 0)) for name in names),
        sum(int(stats.get(name, {}).get("usec", 0)) for name in names),
    )


def _is_script(command: bytes | str) -> bool:
    raw = command.encode() if isinstance(command, str) else command
    return raw.split(b" ", 1)[0].upper() in (b"EVALSHA", b"EVAL")


def server_mark(admin: redis.Redis) -> tuple[int, int]:
    admin.slowlog_reset()
    return _script_counters(admin)


def server_cost(admin: redis.Redis, mark: tuple[int, int]) -> ServerCost:
    counters = _script_counters(admin)
    calls, script_ms = counters[0] - mark[0], (counters[1] - mark[1]) / 1000
    logged = sorted(
        int(entry["duration"])
        for entry in admin.slowlog_get(SLOWLOG_LENGTH)
        if _is_script(entry["command"])
    )
    if not logged:
        return ServerCost(calls, None, None, script_ms)
    # Calls that did not reach the slow log took less than its threshold:
    # counting them at it makes the median an upper bound.
    padded = [SLOWLOG_THRESHOLD_US] * max(calls - len(logged), 0) + logged
    return ServerCost(calls, logged[-1] / 1000, statistics.median(padded) / 1000, script_ms)


# -- workload and contenders -------------------------------------------------


class Workload:
    """N jobs with realistic ids and tokens, and their locks on the server."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.ids = [f"job:{i:06d}" for i in range(size)]
        self.tokens = [str(uuid.uuid4()) for _ in range(size)]
        self.lock_keys = [KEYS.lock(job_id) for job_id in self.ids]
        self._commands: list[tuple[object, ...]] = [
            ("SET", key, token, "PX", LOCK_DURATION)
            for key, token in zip(self.lock_keys, self.tokens, strict=True)
        ]
        for start in range(0, size, 10_000):
            self._commands.append(("SADD", KEYS.stalled, *self.ids[start : start + 10_000]))
        self._packed = PackedCommands(self._commands)

    def reset(self, admin: redis.Redis) -> None:
        """Give every lock a fresh TTL and put every id back in the stalled set.

        One pipeline, packed once.
        """
        self._packed.send(admin)
        gc.collect()


def track_all(ref: ManagerRef, workload: Workload) -> None:
    """Track every job of ``workload`` with ``ref``; return once the manager has them all."""
    for job_id, token in zip(workload.ids, workload.tokens, strict=True):
        track_job(ref, job_id, token)
    assert get_active_job_count(ref, timeout=ASK_TIMEOUT) == workload.size


def asked_tick(ref: ManagerRef, renewed: list[int], size: int) -> float:
    """Seconds an asked tick of ``ref`` takes, checked to renew all ``size`` locks.

    ``renewed`` is the list ``on_locks_renewed`` appends each tick's count to.
    """
    ticks = len(renewed)
    started = time.perf_counter()
    ref.ask(ExtendLocks(), timeout=ASK_TIMEOUT)
    elapsed = time.perf_counter() - started
    assert renewed[ticks:] == [size], "the tick did not renew every lock"
    return elapsed


class TickContender:
    """A manager tracking every job of the workload, ticked by hand."""

    def __init__(self, url: str, workload: Workload, max_batch: int = MAX_BATCH) -> None:
        self.size = workload.size
        self.client = counting_client(url)
        self.clock = ManualClock()
        self.renewed: list[int] = []
        self.ref = start_link(
            connection=self.client,
            keys=KEYS,
            lock_duration=LOCK_DURATION,
            on_locks_renewed=self._on_renewed,
            max_batch=max_batch,
            clock=self.clock,
            # Ticked by hand only: the timer never fires by itself.
            timer=ManualTimer,
        )
        track_all(self.ref, workload)

    def _on_renewed(self, job_ids: list[str]) -> None:
        self.renewed.append(len(job_ids))

    def run(self) -> float:
        self.clock.advance(ALL_DUE_MS)
        return asked_tick(self.ref, self.renewed, self.size)

    def query_delay(self) -> float:
        """Seconds a query asked right after a tick's message waits for its answer."""
        self.clock.advance(ALL_DUE_MS)
        self.ref.tell(ExtendLocks())
        started = time.perf_counter()
        get_active_job_count(self.ref, timeout=ASK_TIMEOUT)
        return time.perf_counter() - started

    def close(self) -> None:
        stop(self.ref, timeout=ASK_TIMEOUT)
        self.client.close()


def bare_calls(client: redis.Redis, workload: Workload, max_batch: int = MAX_BATCH) -> float:
    """Send the tick's script calls straight through redis-py."""
    ids, tokens, size = workload.ids, workload.tokens, workload.size
    sha = script_sha()
    started = time.perf_counter()
    if size <= max_batch:
        replies = [
            client.evalsha(
                sha, 1, KEYS.stalled, KEYS.key_prefix,
                msgpack.packb(tokens), msgpack.packb(ids), LOCK_DURATION,
            )
        ]  # fmt: skip
    else:
        pipe = client.pipeline(transaction=False)
        for start in range(0, size, max_batch):
            stop_at = start + max_batch
            pipe.evalsha(
                sha, 1, KEYS.stalled, KEYS.key_prefix,
                msgpack.packb(tokens[start:stop_at]), msgpack.packb(ids[start:stop_at]),
                LOCK_DURATION,
            )  # fmt: skip
        replies = pipe.execute()
    elapsed = time.perf_counter() - started
    assert all(reply == [] for reply in replies), "a bare call failed to renew a lock"
    return elapsed


def _cpu_ticks(pid: int) -> int:
    """The CPU time process ``pid`` has used so far, in clock ticks."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


class ProcessTickContender:
    """A process-mode manager tracking every job of the workload; a tick asked by hand.

    Its child keeps its own clock and grid, so the lock duration is an hour
    (no grid tick comes during the run), and before each round every job is
    tracked again with a stamp a window old: the asked tick finds all of them
    due. The script calls are the thread mode's (only the TTL they set differs).
    """

    def __init__(self, url: str, workload: Workload, max_batch: int = MAX_BATCH) -> None:
        self.workload = workload
        self.renewed: list[int] = []
        self.ref = start_link(
            connection=url,
            keys=KEYS,
            lock_duration=QUIET_LOCK_DURATION,
            on_locks_renewed=self._on_renewed,
            max_batch=max_batch,
            isolation="process",
        )
        [self.child] = wait_for(children, 30, "the manager's child process")
        track_all(self.ref, workload)

    def _on_renewed(self, job_ids: list[str]) -> None:
        self.renewed.append(len(job_ids))

    def make_due(self) -> None:
        """Track every job again, stamped a window ago; return once the child is idle."""
        ref, workload = self.ref, self.workload
        for job_id in workload.ids:
            untrack_job(ref, job_id)
        stamp = ref.clock() - QUIET_LOCK_DURATION
        for job_id, token in zip(workload.ids, workload.tokens, strict=True):
            track_job(ref, job_id, token, ts=stamp)
        # The last one again, waited for: it changes nothing, and comes after the others.
        job_id, token = workload.ids[-1], workload.tokens[-1]
        track_job(ref, job_id, token, ts=stamp, wait=True, timeout=ASK_TIMEOUT)
        # Every word is in the child's socket: idle twice in a row, it has read them.
        idle, used = 0, _cpu_ticks(self.child)
        while idle < 2:
            time.sleep(0.05)
            now = _cpu_ticks(self.child)
            idle, used = (idle + 1 if now == used else 0), now

    def run(self) -> float:
        return asked_tick(self.ref, self.renewed, self.workload.size)

    def close(self) -> None:
        stop(self.ref, timeout=ASK_TIMEOUT)


class FloorContender:
    """The server's own work for a tick's calls: packed beforehand, sent in one write.

    Nothing of the client's is timed but the write and reading the replies:
    what is left is the server parsing the calls, running the scripts and
    writing its answers, over loopback. No client can renew faster.
    """

    def __init__(self, url: str, workload: Workload, max_batch: int = MAX_BATCH) -> None:
        self.client = redis.Redis.from_url(url, socket_timeout=ASK_TIMEOUT)
        self.connection = self.client.connection_pool.get_connection()
        ids, tokens, sha = workload.ids, workload.tokens, script_sha()
        calls = [
            (
                "EVALSHA", sha, 1, KEYS.stalled, KEYS.key_prefix,
                msgpack.packb(tokens[start : start + max_batch]),
                msgpack.packb(ids[start : start + max_batch]),
                LOCK_DURATION,
            )
            for start in range(0, workload.size, max_batch)
        ]  # fmt: skip
        self.count = len(calls)
        self.packed = self.connection.pack_commands(calls)  # type: ignore[no-untyped-call]

    def run(self) -> float:
        connection = self.connection
        started = time.perf_counter()
        connection.send_packed_command(self.packed)  # type: ignore[no-untyped-call]
        replies = [connection.read_response() for _ in range(self.count)]
        elapsed = time.perf_counter() - started
        assert all(reply == [] for reply in replies), "a floor call failed to renew a lock"
        return elapsed

    def close(self) -> None:
        self.client.connection_pool.release(self.connection)
        self.client.close()


class _StandInWorker:
    """What bullmq's ``LockManager`` uses of its ``Worker``: a backend and ``emit``."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.renewed: list[int] = []
        self.failures: list[object] = []

    def emit(self, event: str, *args: Any) -> None:
        if event == "locksRenewed":
            self.renewed.append(int(args[0]["count"]))
        else:
            self.failures.append((event, args))


class BullmqContender:
    """The ``bullmq`` package's lock manager, tracking every job of the workload."""

    def __init__(self, loop: asyncio.AbstractEventLoop, url: str, workload: Workload) -> None:
        self.loop = loop
        self.size = workload.size
        # The client bullmq builds for itself, plus a write counter.
        self.client = redis.asyncio.Redis.from_url(
            url,
            decode_responses=True,
            single_connection_client=True,
            socket_timeout=ASK_TIMEOUT,
            connection_class=AsyncCountingConnection,
        )
        backend = RedisBackend("bench", RedisConnection(self.client), prefix=KEYS.prefix)
        self.worker = _StandInWorker(backend)
        self.manager = BullLockManager(
            self.worker,
            lock_renew_time=LOCK_DURATION // 2,
            lock_duration=LOCK_DURATION,
            worker_id="bench",
        )
        for job_id, token in zip(workload.ids, workload.tokens, strict=True):
            self.manager.track_job(job_id, token, 1)

    def run(self) -> float:
        cycles = len(self.worker.renewed)
        started = time.perf_counter()
        self.loop.run_until_complete(self.manager._extend_locks(list(self.manager.tracked_jobs)))
        elapsed = time.perf_counter() - started
        assert not self.worker.failures, f"bullmq reported {self.worker.failures[:3]}"
        assert self.worker.renewed[cycles:] == [self.size], "bullmq did not renew every lock"
        return elapsed

    def close(self) -> None:
        self.loop.run_until_complete(self.client.aclose())


def per_job_calls(client: redis.Redis, sha: str, workload: Workload) -> float:
    """One ``extendLock-2.lua`` call per job, all in one pipeline."""
    stalled = KEYS.stalled
    started = time.perf_counter()
    pipe = client.pipeline(transaction=False)
    for key, token, job_id in zip(workload.lock_keys, workload.tokens, workload.ids, strict=True):
        pipe.evalsha(sha, 2, key, stalled, token, LOCK_DURATION, job_id)
    replies = pipe.execute()
    elapsed = time.perf_counter() - started
    assert all(reply == 1 for reply in replies), "a per-job call failed to renew a lock"
    return elapsed


# -- rounds ------------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    """One contender's run in one round."""

    seconds: float
    round_trips: int
    server: ServerCost


@dataclass
class Results:
    """Every contender's samples, in round order."""

    samples: dict[str, list[Sample]] = field(default_factory=dict)

    def seconds(self, name: str) -> list[float]:
        return [sample.seconds for sample in self.samples[name]]

    def median_ms(self, name: str) -> float:
        return statistics.median(self.seconds(name)) * 1000

    def ratios(self, name: str, other: str) -> list[float]:
        return [a / b for a, b in zip(self.seconds(name), self.seconds(other), strict=True)]

    def ratio(self, name: str, other: str) -> float:
        return statistics.median(self.ratios(name, other))

    def script_ratios(self, name: str) -> list[float]:
        """Each round's time over the server's time running that round's scripts."""
        return [
            sample.seconds * 1000 / sample.server.script_ms
            for sample in self.samples[name]
            if sample.server.script_ms > 0
        ]

    def script_ratio(self, name: str) -> float:
        return statistics.median(self.script_ratios(name))

    def server_median(self, name: str, attribute: str) -> float | None:
        values = [getattr(sample.server, attribute) for sample in self.samples[name]]
        known = [value for value in values if value is not None]
        # A value under the slow log threshold stays unknown; the median is
        # only given when most rounds had one.
        return statistics.median(values) if len(known) == len(values) else None


def _nothing() -> None:
    return None


def rounds_for(size: int) -> int:
    return ROUNDS if size >= 100_000 else 3 * ROUNDS


def run_rounds(
    contenders: dict[str, Callable[[], float]],
    reset: Callable[[], None],
    admin: redis.Redis,
    rounds: int,
    rng: random.Random,
    prepare: dict[str, Callable[[], None]] | None = None,
) -> Results:
    """Warm every contender up once, then run ``rounds`` rounds in random orders.

    ``prepare`` holds, by contender, what to do untimed before each of its runs.
    """
    ready = prepare or {}
    for name, run in contenders.items():
        reset()
        ready.get(name, _nothing)()
        run()
    results = Results({name: [] for name in contenders})
    for _ in range(rounds):
        order = list(contenders)
        rng.shuffle(order)
        for name in order:
            reset()
            ready.get(name, _nothing)()
            mark = server_mark(admin)
            _reset_write_counts()
            seconds = contenders[name]()
            round_trips = _write_count()
            results.samples[name].append(Sample(seconds, round_trips, server_cost(admin, mark)))
    return results


# -- formatting --------------------------------------------------------------


def _ms(value: float | None) -> str:
    if value is None:
        return f"< {SLOWLOG_THRESHOLD_US / 1000:g}"
    return f"{value:,.1f}" if value >= 10 else f"{value:,.2f}"


def _x(value: float) -> str:
    return f"{value:.2f}x"


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    event_loop = asyncio.new_event_loop()
    try:
        yield event_loop
    finally:
        event_loop.close()


# -- the benchmarks ----------------------------------------------------------


def test_tick_against_bare_calls_bullmq_and_per_job_calls(
    bench_server: BenchServer,
    admin: redis.Redis,
    loop: asyncio.AbstractEventLoop,
    report: Report,
) -> None:
    # Given N due jobs with real locks, tracked by every contender
    rng = random.Random(SEED)
    per_job_script = PER_JOB_SCRIPT.read_text(encoding="utf-8")
    rows: list[list[str]] = []
    ratio_rows: list[list[str]] = []
    by_size: dict[int, Results] = {}
    delay_ms: list[float] = []
    for size in SIZES:
        admin.flushall()
        admin.script_load(script_source())
        per_job_sha = admin.script_load(per_job_script)
        workload = Workload(size)
        tick = TickContender(bench_server.url, workload)
        process = ProcessTickContender(bench_server.url, workload)
        bullmq = BullmqContender(loop, bench_server.url, workload)
        floor = FloorContender(bench_server.url, workload)
        bare_client = counting_client(bench_server.url)
        try:
            contenders: dict[str, Callable[[], float]] = {
                "tick": tick.run,
                "process": process.run,
                "floor": floor.run,
                "bare": functools.partial(bare_calls, bare_client, workload),
                "bullmq-py": bullmq.run,
            }
            if size <= PER_JOB_MAX:
                contenders["per-job"] = functools.partial(
                    per_job_calls, bare_client, per_job_sha, workload
                )

            # When each renews them all, in a random order per round
            reset = functools.partial(workload.reset, admin)
            results = run_rounds(
                contenders, reset, admin, rounds_for(size), rng, {"process": process.make_due}
            )
            if size == max(SIZES):
                for _ in range(ROUNDS):
                    workload.reset(admin)
                    delay_ms.append(tick.query_delay() * 1000)
                    # The told tick may still be running: let it end.
                    get_active_job_count(tick.ref, timeout=ASK_TIMEOUT)
        finally:
            tick.close()
            process.close()
            bullmq.close()
            floor.close()
            bare_client.close()
        by_size[size] = results
        rows.append(
            [
                f"{size:,}",
                str(rounds_for(size)),
                _ms(results.median_ms("tick")),
                _ms(statistics.median(s.server.script_ms for s in results.samples["tick"])),
                _x(results.script_ratio("tick")),
                _ms(results.median_ms("process")),
                _x(results.script_ratio("process")),
                _ms(results.median_ms("floor")),
                _x(results.script_ratio("floor")),
                _x(results.script_ratio("tick") / results.script_ratio("floor")),
                _ms(results.median_ms("bare")),
                _ms(results.median_ms("bullmq-py")),
                _ms(results.median_ms("per-job")) if "per-job" in results.samples else "—",
                _x(results.ratio("tick", "bare")),
                _x(results.ratio("tick", "bullmq-py")),
                _x(results.ratio("tick", "per-job")) if "per-job" in results.samples else "—",
                _ms(results.server_median("tick", "longest_ms")),
                _ms(results.server_median("tick", "median_ms")),
                _ms(results.server_median("bullmq-py", "longest_ms")),
                str(max(sample.round_trips for sample in results.samples["tick"])),
                str(max(sample.server.script_calls for sample in results.samples["tick"])),
            ]
        )
        ratio_rows.append(
            [
                f"{size:,}",
                " ".join(f"{r:.3f}" for r in results.script_ratios("tick")),
                " ".join(f"{r:.3f}" for r in results.script_ratios("process")),
                " ".join(f"{r:.3f}" for r in results.script_ratios("floor")),
                " ".join(f"{r:.2f}" for r in results.ratios("tick", "bullmq-py")),
            ]
        )

    # Then the report shows every figure, and the targets hold
    report.section(
        f"### Renewing N due locks, max_batch={MAX_BATCH:,} (medians over rounds, times in ms)\n\n"
        + markdown_table(
            [
                "due jobs",
                "rounds",
                "full tick",
                "server: scripts",
                "tick / server",
                "tick, process mode",
                "process / server",
                "floor",
                "floor / server",
                "tick / floor",
                "bare calls",
                "bullmq-py",
                "per-job (pipelined)",
                "tick / bare",
                "tick / bullmq-py",
                "tick / per-job",
                "longest script: tick",
                "median script: tick",
                "longest script: bullmq-py",
                "round trips per tick",
                "script calls per tick",
            ],
            rows,
        )
        + (
            f"\nA query asked right after a {max(SIZES):,}-job tick started waited "
            f"{statistics.median(delay_ms):,.0f} ms (median): the actor answers it once the "
            "tick is done.\n"
            if delay_ms
            else ""
        )
    )
    report.section(
        "### Per-round ratios over the server's script time of the same run\n\n"
        + markdown_table(
            [
                "due jobs",
                "tick / server",
                "process mode / server",
                "floor / server",
                "tick / bullmq-py",
            ],
            ratio_rows,
        )
    )
    checks = [
        report.check(
            f"{size:,} jobs: round trips per tick",
            max(sample.round_trips for sample in by_size[size].samples["tick"]),
            1,
            "",
            at_most=True,
        )
        for size in SIZES
    ]
    for size in (10_000, 100_000):
        if size in by_size:
            checks += [
                report.check(
                    f"{size:,} jobs: tick / server's script time",
                    by_size[size].script_ratio("tick"),
                    TICK_OVER_SCRIPTS,
                    "x",
                    at_most=True,
                ),
                report.check(
                    f"{size:,} jobs: process-mode tick / server's script time",
                    by_size[size].script_ratio("process"),
                    PROCESS_TICK_OVER_SCRIPTS,
                    "x",
                    at_most=True,
                ),
            ]
    if 100_000 in by_size:
        big = by_size[100_000]
        longest = big.server_median("tick", "longest_ms")
        median = big.server_median("tick", "median_ms")
        checks += [
            report.check(
                "100,000 jobs: longest single script",
                SLOWLOG_THRESHOLD_US / 1000 if longest is None else longest,
                10,
                "ms",
                at_most=True,
            ),
            report.check(
                "100,000 jobs: median script call",
                SLOWLOG_THRESHOLD_US / 1000 if median is None else median,
                3,
                "ms",
                at_most=True,
            ),
            report.check(
                "100,000 jobs: tick / bullmq-py",
                big.ratio("tick", "bullmq-py"),
                0.8,
                "x",
                at_most=True,
            ),
        ]
    if 10_000 in by_size:
        mid = by_size[10_000]
        checks += [
            report.check(
                "10,000 jobs: tick / bare calls", mid.ratio("tick", "bare"), 1.15, "x", at_most=True
            ),
            report.check(
                "10,000 jobs: tick / bullmq-py",
                mid.ratio("tick", "bullmq-py"),
                1.0,
                "x",
                at_most=True,
            ),
        ]
    assert all(checks), "a renewal target was missed: see the report"


def _chunk_verdict(results: Results) -> str:
    fastest = min(BATCHES, key=lambda batch: results.ratio(str(batch), str(DEFAULT_MAX_BATCH)))
    short = [
        batch
        for batch in BATCHES
        if (longest := results.server_median(str(batch), "longest_ms")) is None or longest <= 10
    ]
    verdict = f"\nFastest full tick (per-round median): max_batch={fastest:,}"
    if short:
        listed = ", ".join(f"{batch:,}" for batch in short)
        verdict += f"; longest script within 10 ms at max_batch {listed}"
    return verdict + ".\n"


def test_chunk_size(bench_server: BenchServer, admin: redis.Redis, report: Report) -> None:
    # Given the largest N due jobs, tracked by one manager per max_batch
    size = max(SIZES)
    rng = random.Random(SEED + 1)
    admin.flushall()
    admin.script_load(script_source())
    workload = Workload(size)
    ticks = {batch: TickContender(bench_server.url, workload, max_batch=batch) for batch in BATCHES}
    try:
        # When each renews them all, in a random order per round
        results = run_rounds(
            {str(batch): tick.run for batch, tick in ticks.items()},
            functools.partial(workload.reset, admin),
            admin,
            CHUNK_ROUNDS,
            rng,
        )
    finally:
        for tick in ticks.values():
            tick.close()

    # Then the report compares them with the default
    default = str(DEFAULT_MAX_BATCH)
    rows = [
        [
            f"{batch:,}" + (" (default)" if batch == DEFAULT_MAX_BATCH else ""),
            str(results.samples[str(batch)][0].server.script_calls),
            _ms(results.median_ms(str(batch))),
            _x(results.ratio(str(batch), default)),
            _ms(results.server_median(str(batch), "longest_ms")),
            _ms(results.server_median(str(batch), "median_ms")),
        ]
        for batch in BATCHES
    ]
    report.section(
        f"### max_batch at {size:,} due jobs ({CHUNK_ROUNDS} rounds, medians, times in ms)\n\n"
        + markdown_table(
            [
                "max_batch",
                "script calls",
                "full tick",
                "vs default, per-round median",
                "longest script",
                "median script",
            ],
            rows,
        )
        + _chunk_verdict(results)
    )
    for batch in BATCHES:
        assert results.samples[str(batch)][0].server.script_calls == -(-size // batch)


class NoOpActor(pykka.ThreadingActor):
    """Receives anything and does nothing: the cost of pykka's messaging alone."""

    use_daemon_thread = True

    def on_receive(self, message: Any) -> None:
        return None


def _in_threads(count: int, work: Callable[[int], None]) -> None:
    """Run ``work(i)`` for each ``i`` of ``count`` on threads of its own, all at once; wait."""
    if count == 1:
        work(0)
        return
    start = threading.Barrier(count)

    def run(i: int) -> None:
        start.wait(ASK_TIMEOUT)
        work(i)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(ASK_TIMEOUT)


@pytest.mark.parametrize("callers", CALLERS)
def test_track_and_untrack_rate(bench_server: BenchServer, report: Report, callers: int) -> None:
    # Given a running manager and a no-op actor, and the same messages for both
    half = MESSAGES // 2
    ids = [f"job:{i:06d}" for i in range(half)]
    tokens = [str(uuid.uuid4()) for _ in range(half)]
    # Each caller thread its own share: as job actors track their own jobs.
    shares = [
        (ids[i::callers], tokens[i::callers], [UntrackJob(job_id) for job_id in ids[i::callers]])
        for i in range(callers)
    ]
    client = redis.Redis.from_url(bench_server.url, socket_timeout=5)
    manager = start_link(connection=client, keys=KEYS, lock_duration=QUIET_LOCK_DURATION)
    in_process = start_link(
        connection=bench_server.url,
        keys=KEYS,
        lock_duration=QUIET_LOCK_DURATION,
        isolation="process",
    )
    noop = NoOpActor.start()

    def helpers_of(ref: ManagerRef) -> Callable[[int], None]:
        def by_helpers(i: int) -> None:
            share_ids, share_tokens, _ = shares[i]
            for job_id, token in zip(share_ids, share_tokens, strict=True):
                track_job(ref, job_id, token)
            for job_id in share_ids:
                untrack_job(ref, job_id)

        return by_helpers

    def by_tells(i: int) -> None:
        share_ids, share_tokens, untracks = shares[i]
        for job_id, token in zip(share_ids, share_tokens, strict=True):
            noop.tell(TrackJob(job_id, token))
        for message in untracks:
            noop.tell(message)

    def drive_manager() -> float:
        started = time.perf_counter()
        _in_threads(callers, helpers_of(manager))
        assert get_active_job_count(manager, timeout=ASK_TIMEOUT) == 0
        return time.perf_counter() - started

    def drive_process() -> float:
        started = time.perf_counter()
        _in_threads(callers, helpers_of(in_process))
        # Done once every word is in the child's socket.
        track_job(in_process, "sentinel", "sentinel", wait=True, timeout=ASK_TIMEOUT)
        elapsed = time.perf_counter() - started
        untrack_job(in_process, "sentinel", wait=True, timeout=ASK_TIMEOUT)
        assert get_active_job_count(in_process, timeout=ASK_TIMEOUT) == 0
        return elapsed

    def drive_noop() -> float:
        started = time.perf_counter()
        _in_threads(callers, by_tells)
        noop.ask(None, timeout=ASK_TIMEOUT)
        return time.perf_counter() - started

    # When both drain the same number of tells, in a random order per round
    rng = random.Random(SEED + 2 + callers)
    rounds = 3 * ROUNDS
    drivers = {"manager": drive_manager, "process": drive_process, "no-op": drive_noop}
    seconds: dict[str, list[float]] = {name: [] for name in drivers}
    try:
        for driver in drivers.values():
            driver()
        for _ in range(rounds):
            order = list(drivers)
            rng.shuffle(order)
            for name in order:
                gc.collect()
                seconds[name].append(drivers[name]())
    finally:
        stop(manager)
        stop(in_process)
        noop.stop()
        client.close()

    # Then the manager keeps pykka's own message rate, and process mode nearly the manager's
    def per_round(name: str, other: str) -> list[float]:
        return [b / a for a, b in zip(seconds[name], seconds[other], strict=True)]

    ratios = per_round("manager", "no-op")
    process_ratios = per_round("process", "manager")
    rate = {name: MESSAGES / statistics.median(values) for name, values in seconds.items()}
    report.section(
        f"### Messages from {callers} caller thread(s): {half:,} track_job + {half:,} "
        f"untrack_job (median of {rounds} rounds)\n\n"
        + markdown_table(
            ["actor", "messages/s", "vs no-op, per round", "vs thread mode, per round"],
            [
                [
                    "LockManager (track_job/untrack_job)",
                    f"{rate['manager']:,.0f}",
                    " ".join(f"{r:.2f}" for r in ratios),
                    "1.00",
                ],
                [
                    "LockManager, process mode",
                    f"{rate['process']:,.0f}",
                    " ".join(f"{r:.2f}" for r in per_round("process", "no-op")),
                    " ".join(f"{r:.2f}" for r in process_ratios),
                ],
                ["no-op pykka actor (tell)", f"{rate['no-op']:,.0f}", "1.00", ""],
            ],
        )
    )
    passed = [
        report.check(
            f"{callers} caller(s): track+untrack rate / no-op actor's tell rate",
            statistics.median(ratios),
            TELL_RATE,
            "x",
            at_most=False,
        ),
        report.check(
            f"{callers} caller(s): process-mode track+untrack rate / thread mode's",
            statistics.median(process_ratios),
            PROCESS_RATE,
            "x",
            at_most=False,
        ),
    ]
    assert all(passed), "the manager handles tells too slowly: see the report"


def test_bytes_per_tracked_job(bench_server: BenchServer, report: Report) -> None:
    # Given a running manager
    client = redis.Redis.from_url(bench_server.url, socket_timeout=5)
    manager = start_link(connection=client, keys=KEYS, lock_duration=QUIET_LOCK_DURATION)
    try:
        assert get_active_job_count(manager, timeout=ASK_TIMEOUT) == 0
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.take_snapshot()

            # When it tracks MEMORY_JOBS jobs whose ids and tokens only it keeps
            for i in range(MEMORY_JOBS):
                track_job(manager, f"job:{i:06d}", str(uuid.uuid4()))
            assert get_active_job_count(manager, timeout=ASK_TIMEOUT) == MEMORY_JOBS
            gc.collect()
            after = tracemalloc.take_snapshot()
        finally:
            tracemalloc.stop()
    finally:
        stop(manager)
        client.close()

    # Then its state costs at most a few hundred bytes per job
    growth = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    per_job = growth / MEMORY_JOBS
    report.section(
        f"### Memory\n\n{MEMORY_JOBS:,} tracked jobs (ids like `job:000042`, uuid4 tokens) "
        f"grow the process by {growth / 1e6:,.1f} MB: {per_job:,.0f} bytes per job, "
        "id and token strings included.\n"
    )
    passed = report.check(
        f"bytes per tracked job at {MEMORY_JOBS:,}", per_job, BYTES_PER_JOB, "B", at_most=True
    )
    assert passed, "tracked jobs take too much memory: see the report"
