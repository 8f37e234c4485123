"""Process isolation against thread mode: the cost of the door through a child process.

Run with ``pytest -m bench -s -p no:randomly tests/bench/test_isolation.py``.
Both modes run in the same round on the same server; the figures are medians
over rounds, and the ratios (process / thread) are what the targets read.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from actors import (
    QueueKeys,
    get_active_job_count,
    start_link,
    stop,
    track_job,
    untrack_job,
)
from tests.isolation.conftest import children
from tests.support import wait_for

if TYPE_CHECKING:
    from tests.support import Server

pytestmark = pytest.mark.bench

KEYS = QueueKeys("bench-isolation")
#: Jobs tracked and untracked per round.
JOBS = 20_000
#: Waited untracks timed per round.
WAITS = 500
ROUNDS = 3


def _tracks_per_second(url: str, isolation: str) -> float:
    manager = start_link(connection=url, keys=KEYS, lock_duration=30_000, isolation=isolation)
    try:
        started = time.perf_counter()
        for i in range(JOBS):
            track_job(manager, f"j{i}", "token")
        for i in range(JOBS):
            untrack_job(manager, f"j{i}")
        # Done once the renewing side has taken every message.
        assert get_active_job_count(manager) == 0
        return 2 * JOBS / (time.perf_counter() - started)
    finally:
        stop(manager)


def _untrack_wait_us(url: str, isolation: str) -> float:
    manager = start_link(connection=url, keys=KEYS, lock_duration=30_000, isolation=isolation)
    try:
        samples = []
        for i in range(WAITS):
            track_job(manager, f"w{i}", "token")
            started = time.perf_counter()
            untrack_job(manager, f"w{i}", wait=True)
            samples.append((time.perf_counter() - started) * 1e6)
        return statistics.median(samples)
    finally:
        stop(manager)


def test_process_mode_costs_at_most_twice_thread_mode(server: Server) -> None:
    rates: dict[str, list[float]] = {"thread": [], "process": []}
    waits: dict[str, list[float]] = {"thread": [], "process": []}
    for _ in range(ROUNDS):
        for isolation in ("thread", "process"):
            rates[isolation].append(_tracks_per_second(server.url, isolation))
            waits[isolation].append(_untrack_wait_us(server.url, isolation))
    rate = {mode: statistics.median(values) for mode, values in rates.items()}
    wait = {mode: statistics.median(values) for mode, values in waits.items()}
    print(
        "\n| mode | tracks+untracks/s | untrack(wait=True) median µs |\n|---|---|---|\n"
        + "\n".join(f"| {m} | {rate[m]:,.0f} | {wait[m]:.0f} |" for m in rate)
        + f"\n\nrate ratio process/thread: {rate['process'] / rate['thread']:.2f}; "
        f"wait ratio process/thread: {wait['process'] / wait['thread']:.2f}"
    )
    assert rate["process"] >= rate["thread"] / 2
    assert wait["process"] <= 2 * wait["thread"]


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


def test_the_child_s_memory_idle_and_with_10000_tracked_jobs(server: Server) -> None:
    # The child's resident memory: a Python interpreter with redis-py and pykka.
    manager = start_link(
        connection=server.url, keys=KEYS, lock_duration=30_000, isolation="process"
    )
    try:
        [child] = wait_for(children, 10, "the child")
        assert get_active_job_count(manager) == 0
        idle = _rss_kib(child)
        for i in range(10_000):
            track_job(manager, f"m{i}", "token")
        assert get_active_job_count(manager) == 10_000
        tracked = _rss_kib(child)
    finally:
        stop(manager)
    print(
        f"\nchild process resident memory: {idle / 1024:.1f} MiB idle, "
        f"{tracked / 1024:.1f} MiB with 10,000 tracked jobs "
        f"({(tracked - idle) * 1024 / 10_000:.0f} bytes per job)"
    )
    assert idle < 64 * 1024
