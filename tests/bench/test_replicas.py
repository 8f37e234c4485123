"""What a tick costs when a replica must confirm it: ``replicas=1`` against the primary's word.

Two managers renew the same N locks on a primary with one replica (both
servers private, on loopback), one with ``replicas=1`` (``WAIT 1`` after the
tick's script calls, in the same round trip), one without; each tick is asked
by hand, all N jobs due, in rounds of random order. The table gives the median
tick of each and the median of the per-round ratios, with their range.
"""

from __future__ import annotations

import random
import statistics
import time
from typing import TYPE_CHECKING

import pytest
import redis

from actors import ExtendLocks, ManualTimer, start_link, stop, track_job
from tests.bench.conftest import ASK_TIMEOUT, SEED, env_ints
from tests.bench.test_bench import ALL_DUE_MS, KEYS, LOCK_DURATION, Workload
from tests.support.manual import ManualClock
from tests.support.replication import ReplicatedPair

if TYPE_CHECKING:
    from tests.bench.conftest import Report

pytestmark = pytest.mark.bench

SIZES = env_ints("ACTORS_BENCH_REPLICA_SIZES", "1000,10000")
ROUNDS = 15


class Ticker:
    """A manager tracking every job of the workload, ticked by hand."""

    def __init__(self, url: str, workload: Workload, replicas: int) -> None:
        self.size = workload.size
        self.clock = ManualClock()
        self.renewed: list[int] = []
        self.client = redis.Redis.from_url(url, socket_timeout=ASK_TIMEOUT)
        self.ref = start_link(
            connection=self.client,
            keys=KEYS,
            lock_duration=LOCK_DURATION,
            on_locks_renewed=lambda ids: self.renewed.append(len(ids)),
            clock=self.clock,
            timer=ManualTimer,
            replicas=replicas,
        )
        for job_id, token in zip(workload.ids, workload.tokens, strict=True):
            track_job(self.ref, job_id, token)

    def tick(self) -> float:
        ticks = len(self.renewed)
        self.clock.advance(ALL_DUE_MS)
        started = time.perf_counter()
        self.ref.ask(ExtendLocks(), timeout=ASK_TIMEOUT)
        elapsed = time.perf_counter() - started
        assert self.renewed[ticks:] == [self.size], "the tick did not renew (or confirm) every lock"
        return elapsed

    def close(self) -> None:
        stop(self.ref, timeout=ASK_TIMEOUT)
        self.client.close()


def test_a_tick_confirmed_by_a_replica(report: Report) -> None:
    rng = random.Random(SEED + 49)
    rows = []
    with ReplicatedPair() as pair:
        admin = pair.client()
        for size in SIZES:
            workload = Workload(size)
            admin.flushall()
            workload.reset(admin)
            tickers = {
                "primary": Ticker(pair.primary.url, workload, 0),
                "replicas=1": Ticker(pair.primary.url, workload, 1),
            }
            try:
                for ticker in tickers.values():  # warm up
                    workload.reset(admin)
                    ticker.tick()
                times: dict[str, list[float]] = {name: [] for name in tickers}
                for _ in range(ROUNDS):
                    order = list(tickers)
                    rng.shuffle(order)
                    for name in order:
                        workload.reset(admin)
                        times[name].append(tickers[name].tick())
            finally:
                for ticker in tickers.values():
                    ticker.close()
            ratios = [a / b for a, b in zip(times["replicas=1"], times["primary"], strict=True)]
            rows.append(
                f"| {size:,} | {statistics.median(times['primary']) * 1000:,.2f} | "
                f"{statistics.median(times['replicas=1']) * 1000:,.2f} | "
                f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}) |"
            )
        admin.close()
    report.section(
        "### A tick confirmed by a replica (`replicas=1`)\n\n"
        f"One primary and one replica on loopback; medians over {ROUNDS} rounds, the ratio "
        "per round.\n\n"
        "| jobs | tick, primary's word (ms) | tick, `replicas=1` (ms) | ratio |\n"
        "|---:|---:|---:|---:|\n" + "\n".join(rows)
    )
