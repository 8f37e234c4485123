"""Throughput of a bullmq-py ``Worker`` on tiny jobs: stock against the integration's two modes.

Run with ``make bench``, or alone with
``pytest -m bench -s -p no:randomly tests/bench/test_throughput.py``. Knobs
for a quick try: ``THROUGHPUT_JOBS=300``, ``THROUGHPUT_ROUNDS=1``,
``THROUGHPUT_CONCURRENCY=1,8`` and ``THROUGHPUT_WAIT_JOBS=100``. About two
and a half minutes at the defaults on a 2-core machine.

Contenders, each a bullmq-py ``Worker`` whose processor returns at once
(``async def process(job, token): return None``), with bullmq's defaults
(``lockDuration`` 30,000 ms, ``stalledInterval`` 30,000 ms, completed jobs kept:
no ``removeOnComplete``) but for ``concurrency``:

- stock: bullmq-py's own lock renewal;
- thread: ``use_actor_lock_manager(worker)``;
- process: ``use_actor_lock_manager(worker, isolation="process")``.

Each run is a fresh Python process (:mod:`tests.bench.throughput`) on an
emptied server (FLUSHALL) and a queue of its own. bullmq-py's idle
``Worker.close()`` may hang in its blocking fetch (taskforcesh/bullmq#4597): the
process gives its close up after ``CLOSE_S`` and exits, the test kills it if
it outlasts :func:`hard_limit_s`, and the report counts the closes given up.
A close is never timed. In each round the three contenders run in a random
order (seeded), at each concurrency in turn.

What a run measures:

- jobs/s: ``JOBS`` jobs are added (``Queue.addBulk``) before the worker
  starts; the clock runs from the call of ``worker.run()`` to the worker's
  ``JOBS``-th ``completed`` event. The lock manager is started before the
  clock (a process-mode manager spawns its child then: its start is reported
  apart). The figure is the median over rounds; the ratios are taken per round
  (contenders of one round against each other), then their median and range.
- add→start: then, with the worker running, the test adds ``WAIT_JOBS`` jobs
  one by one at ``ADD_RATE`` jobs/s (well below every contender's capacity),
  each with the wall time of its add; its processor records the time from
  that add to its own start. Median and 99th percentile over every such job of
  every round. Both clocks are the machine's, read by two processes.

Every run is checked: each job ran once, the queue holds every job as
completed, and the worker emitted no ``failed``, ``stalled``, ``error`` or
``lockRenewalFailed`` event. The targets are the ratios' medians at each
concurrency; a miss fails the test once the table is recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.bench.conftest import SEED, env_ints, markdown_table
from tests.bench.throughput import CLOSE_S, ISOLATIONS, CloseResult, RunResult, add_steadily, key
from tests.bullmq.harness import wait_until

if TYPE_CHECKING:
    import redis

    from tests.bench.conftest import BenchServer, Report

pytestmark = pytest.mark.bench

#: Worker concurrencies measured.
CONCURRENCIES = env_ints("THROUGHPUT_CONCURRENCY", "1,8,32")
#: Jobs a run's worker is timed through.
JOBS = int(os.environ.get("THROUGHPUT_JOBS", "2000"))
#: Rounds: each contender runs once per round at each concurrency.
ROUNDS = int(os.environ.get("THROUGHPUT_ROUNDS", "3"))
#: Jobs added while the worker runs, per run, for the add→start wait.
WAIT_JOBS = int(os.environ.get("THROUGHPUT_WAIT_JOBS", "500"))
#: Their rate, in jobs per second: a fraction of any contender's throughput.
ADD_RATE = 200.0
#: The contenders, in the table's order.
CONTENDERS = tuple(ISOLATIONS)
#: Least median ratio of each mode's jobs/s to the stock worker's, per concurrency.
TARGETS = {"thread": 0.95, "process": 0.85}
#: The project's root, where ``python -m tests.bench.throughput`` runs.
ROOT = Path(__file__).resolve().parents[2]


def hard_limit_s() -> float:
    """Seconds a contender's process may take in all before it is killed.

    Its start, a minute for the throughput phase (at 100 jobs/s, far below any
    contender), the steady adds, and a close given up after ``CLOSE_S``.
    """
    return 30.0 + max(60.0, JOBS / 100) + WAIT_JOBS / ADD_RATE + 2 * CLOSE_S


@dataclass
class Run:
    """One contender's run, as its process reported it."""

    result: RunResult
    close: CloseResult | None
    #: What the run's checks found wrong (a job run twice, a stalled event...).
    problems: list[str]

    @property
    def rate(self) -> float:
        """Jobs per second through the pre-filled queue."""
        return JOBS / self.result.seconds


def _read(output: str, errors: str) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The result and the close a contender's process wrote (the close may be missing)."""
    lines = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    if not lines:
        raise AssertionError(f"the contender's process reported nothing; stderr:\n{errors[-4000:]}")
    return lines[0], lines[1] if len(lines) > 1 else None


def run_contender(url: str, admin: redis.Redis, contender: str, concurrency: int) -> Run:
    """Run ``contender`` at ``concurrency`` in a process of its own, on an emptied server."""
    admin.flushall()
    queue = f"tp-{contender}-{concurrency}-{uuid.uuid4().hex[:8]}"
    command = [
        sys.executable,
        "-m",
        "tests.bench.throughput",
        url,
        queue,
        contender,
        str(concurrency),
        str(JOBS),
        str(WAIT_JOBS),
    ]
    deadline = time.monotonic() + hard_limit_s()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        process = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=err, text=True)
        try:
            wait_until(
                lambda: admin.exists(key(queue, "bench-ready")) or process.poll() is not None,
                deadline - time.monotonic(),
                f"{contender} at concurrency {concurrency} to complete its {JOBS} jobs",
            )
            assert process.poll() is None, f"{contender}'s process ended early"
            asyncio.run(add_steadily(url, queue, WAIT_JOBS, ADD_RATE))
            # Its result is written before its close: a process that outlives
            # the limit is killed, and what it wrote still counts.
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(max(deadline - time.monotonic(), 1.0))
        except BaseException:
            err.seek(0)
            sys.stderr.write(err.read()[-4000:])
            raise
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        out.seek(0)
        err.seek(0)
        reported, closed = _read(out.read(), err.read())
    completed = int(admin.zcard(key(queue, "completed")))
    result = RunResult(**reported)
    expected = JOBS + WAIT_JOBS
    problems = []
    if result.runs != expected or result.repeats:
        problems.append(f"{result.runs} runs, {result.repeats} of a job run before")
    if completed != expected:
        problems.append(f"{completed} jobs completed in the queue")
    if any(result.events.values()):
        problems.append(f"events {result.events}")
    if len(result.waits) != WAIT_JOBS:
        problems.append(f"{len(result.waits)} waits")
    where = f"{contender} at concurrency {concurrency}: "
    return Run(result, CloseResult(**closed) if closed else None, [where + p for p in problems])


def _ratio(values: list[float]) -> str:
    """Median and range of per-round ratios."""
    return f"{statistics.median(values):.2f}x ({min(values):.2f}-{max(values):.2f})"


def _p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100)[98] if len(values) > 1 else values[0]


def _waits(runs: list[Run]) -> str:
    """Median and 99th percentile, in ms, of the add→start waits of ``runs``."""
    waits = [wait * 1000 for run in runs for wait in run.result.waits]
    if not waits:
        return "—"
    return f"{statistics.median(waits):.1f} / {_p99(waits):.1f}"


def _closes(runs: list[Run]) -> str:
    """Closes given up among ``runs``, and those not (known to be) bullmq-py's idle hang."""
    given_up = [run.close for run in runs if run.close is None or not run.close.closed]
    elsewhere = [close for close in given_up if close is None or not close.bullmq_idle_wait]
    text = f"{len(given_up)}/{len(runs)}"
    if elsewhere:
        text += f" ({len(elsewhere)} killed or hung outside bullmq's idle wait)"
    return text


def test_worker_throughput_stock_thread_and_process(
    bench_server: BenchServer, admin: redis.Redis, report: Report
) -> None:
    # Given a fresh process per run, contenders in a random order per round
    rng = random.Random(SEED + 7)
    runs: dict[int, dict[str, list[Run]]] = {
        concurrency: {name: [] for name in CONTENDERS} for concurrency in CONCURRENCIES
    }
    began = time.monotonic()

    # When each works through the same jobs at each concurrency
    for _ in range(ROUNDS):
        for concurrency in CONCURRENCIES:
            order = list(CONTENDERS)
            rng.shuffle(order)
            for name in order:
                runs[concurrency][name].append(
                    run_contender(bench_server.url, admin, name, concurrency)
                )
    took = time.monotonic() - began

    # Then the report shows every figure, and the targets hold
    rows: list[list[str]] = []
    ratios: dict[int, dict[str, list[float]]] = {}
    for concurrency, by_name in runs.items():
        stock = [run.rate for run in by_name["stock"]]
        ratios[concurrency] = {
            name: [run.rate / base for run, base in zip(by_name[name], stock, strict=True)]
            for name in TARGETS
        }
        rows.append(
            [
                str(concurrency),
                *(f"{statistics.median(run.rate for run in by_name[n]):,.0f}" for n in CONTENDERS),
                *(_ratio(ratios[concurrency][name]) for name in TARGETS),
                *(_waits(by_name[name]) for name in CONTENDERS),
            ]
        )
    every = {
        name: [run for by_name in runs.values() for run in by_name[name]] for name in CONTENDERS
    }
    problems = [
        problem for runs_of in every.values() for run in runs_of for problem in run.problems
    ]
    starts = [run.result.manager_start_s * 1000 for run in every["process"]]
    report.section(
        f"### bullmq-py Worker throughput, tiny jobs: {JOBS:,} per run, {ROUNDS} round(s)\n\n"
        + markdown_table(
            [
                "concurrency",
                "stock jobs/s",
                "thread jobs/s",
                "process jobs/s",
                "thread / stock",
                "process / stock",
                "add→start ms (median / p99): stock",
                "thread",
                "process",
            ],
            rows,
        )
        + f"\njobs/s: median over rounds; ratios: median (min-max) of the per-round ratios. "
        f"add→start: {WAIT_JOBS} jobs per run added at {ADD_RATE:g}/s while the worker runs. "
        f"A process-mode manager's start (its child spawned, off the clock) took "
        f"{statistics.median(starts):,.0f} ms (median). "
        f"Closes given up after {CLOSE_S:g} s: "
        + ", ".join(f"{name} {_closes(every[name])}" for name in CONTENDERS)
        + f". The runs took {took:,.0f} s.\n"
        + "".join(f"\n- {problem}" for problem in problems)
    )
    passed = [
        report.check(
            f"concurrency {concurrency}: {name}-mode jobs/s / stock worker's",
            statistics.median(ratios[concurrency][name]),
            target,
            "x",
            at_most=False,
        )
        for concurrency in CONCURRENCIES
        for name, target in TARGETS.items()
    ]
    assert not problems, "a run went wrong: " + "; ".join(problems)
    assert all(passed), "the integration slows the worker down: see the report"
