"""A job fetched while another job holds the GIL: renewed from the moment the server answers.

In process mode the renewals run in a child process, but the fetch that takes
a job's lock is the worker's: were its answer read in the worker's process, a
processor holding the GIL (C code: a catastrophic regular expression) would
leave the lock the fetch just took untracked for as long as it holds it. The
child runs the fetch itself and tracks the job before it answers.

The link between worker A and the server hands every reply 100 ms late (a
proxy in a process of its own, ``slowlink.py``), so the server takes the next
job well before anyone can read that it did; the GIL-holding processor starts
its hold as soon as the server holds the next job's lock. Worker B, a stock
worker in a process of its own, runs bullmq's stalled check four times per
lock duration and takes no job itself.

The full scenario of the issue (30 jobs, holds of ~2x ``lockDuration``, ten
runs) is ``make gil-fetch`` (``-m scenario``).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import TYPE_CHECKING, Any

import pytest

from tests.bullmq.burn import backtrack, size_for
from tests.bullmq.harness import OUTCOMES, Bench, wait_until
from tests.bullmq.slowlink import slow_link
from tests.isolation.conftest import children

if TYPE_CHECKING:
    from collections.abc import Iterator

    from tests.conftest import Server

#: BullMQ's ``lockDuration``, in milliseconds.
LOCK_MS = 1000
#: How late the link hands worker A each reply, in milliseconds.
REPLY_DELAY_MS = 100
#: How long the GIL is held: two and a half lock durations (checked to outlast one).
HOLD_S = 2.5 * LOCK_MS / 1000
#: Longest wait for the jobs to settle, in seconds, past the hold.
SETTLE_S = 15.0
#: Worker B: a stalled check four times per lock duration, no jobs of its own.
CHECKER = {"lockDuration": LOCK_MS, "stalledInterval": LOCK_MS // 4, "paused": True}


@pytest.fixture
def slow_url(server: Server) -> Iterator[str]:
    with slow_link(server.url, REPLY_DELAY_MS) as (url, _):
        yield url


def test_a_job_fetched_while_another_holds_the_gil_keeps_its_lock(
    one_bench: Bench, server: Server, slow_url: str
) -> None:
    size = size_for(HOLD_S)
    checker = one_bench.start_peer("B", CHECKER)
    runs: list[str] = []
    seen: dict[str, Any] = {}
    gil = one_bench.add_job({"gil": True})
    quick = one_bench.add_job({})

    async def process(job: Any, token: str) -> str:
        runs.append(str(job.id))
        if job.data.get("gil"):
            # The server took the next job's lock; its answer is still on the way.
            wait_until(
                lambda: one_bench.client.exists(one_bench.key(quick, "lock")),
                SETTLE_S,
                "the next job to be taken",
            )
            seen["hold_ms"] = backtrack(size) * 1000
        return "done"

    # Given worker A in process mode, fetching through a link that answers late,
    a = one_bench.start_worker(
        "A",
        process,
        {"lockDuration": LOCK_MS, "concurrency": 4},
        actor=True,
        isolation="process",
        connection=slow_url,
        connection_for_renewal=server.url,
    )
    # when a processor holds the GIL from the moment the server took the next job,
    wait_until(
        lambda: all("finishedOn" in one_bench.job(job) for job in (gil, quick)),
        HOLD_S + SETTLE_S,
        "both jobs to finish",
    )
    wait_until(lambda: not a.busy(), SETTLE_S, "worker A to finish")

    # then the hold outlasted the lock, and yet each job ran once and completed:
    assert seen["hold_ms"] > LOCK_MS
    assert sorted(runs) == sorted([gil, quick])
    assert checker.stalled_ids() == []
    for job in (gil, quick):
        assert one_bench.job(job).get("stc", "0") == "0", job
        assert one_bench.job(job)["ats"] == "1", job
    assert sorted(str(e.args[0].id) for e in a.events.of("completed")) == sorted([gil, quick])
    # no lock was reported lost, and no move was refused.
    assert a.events.of("lockRenewalFailed") == []
    assert a.events.of("error") == []
    assert a.events.of("failed") == []

    OUTCOMES.add(
        "job fetched beside a GIL hold",
        hold_ms=round(seen["hold_ms"]),
        lock_ms=LOCK_MS,
        reply_delay_ms=REPLY_DELAY_MS,
        runs=len(runs),
        stalled=len(checker.stalled_ids()),
    )


#: How late the link answers when the child is killed mid-fetch, in ms: time to kill it.
STOPPED_LINK_DELAY_MS = 300


def test_a_fetch_whose_child_dies_is_handed_on_by_the_stalled_check(
    one_bench: Bench, server: Server
) -> None:
    checker = one_bench.start_peer("B", CHECKER)
    runs: list[str] = []

    async def process(job: Any, token: str) -> str:
        runs.append(str(job.id))
        return "done"

    with slow_link(server.url, STOPPED_LINK_DELAY_MS) as (url, _):
        a = one_bench.start_worker(
            "A",
            process,
            # A fetch that fails for its connection is tried again after runRetryDelay.
            {"lockDuration": LOCK_MS, "runRetryDelay": LOCK_MS // 4},
            actor=True,
            isolation="process",
            connection=url,
            connection_for_renewal=server.url,
        )
        # Given a fetch the server ran, its answer on the way,
        job = one_bench.add_job({})
        wait_until(
            lambda: one_bench.client.exists(one_bench.key(job, "lock")), SETTLE_S, "the fetch"
        )
        # when the child that sent it is killed before it reads the answer,
        [child] = children()
        os.kill(child, signal.SIGKILL)
        # then nobody renews the lock: it expires, the stalled check moves the job
        # back to wait, and worker A takes it again and runs it once.
        wait_until(lambda: a.events.of("completed"), 5 * LOCK_MS / 1000 + SETTLE_S, "the job")
        a.close()
    assert runs == [job]
    assert checker.stalled_ids() == [job]
    assert one_bench.job(job)["stc"] == "1"
    assert a.events.of("lockRenewalFailed") == []
    assert a.events.of("failed") == []


#: The issue's scenario, full size: its ``lockDuration``, concurrency and jobs.
SCENARIO_LOCK_MS = 2000
SCENARIO_JOBS = 30
#: Seven jobs, repeated: one holds the GIL (~2x the lock), one blocks the loop 3 s, five are quick.
SCENARIO_PATTERN = ("gil", "block", "quick", "quick", "quick", "quick", "quick")
SCENARIO_HOLD_S = 2 * SCENARIO_LOCK_MS / 1000
SCENARIO_BLOCK_S = 3.0
#: How many times ``make gil-fetch`` runs it.
SCENARIO_RUNS = int(os.environ.get("GIL_RUNS", "1"))


@pytest.mark.scenario
@pytest.mark.parametrize("run", range(1, SCENARIO_RUNS + 1))
def test_the_issue_scenario_runs_every_job_once(one_bench: Bench, run: int) -> None:
    size = size_for(SCENARIO_HOLD_S)
    checker = one_bench.start_peer(
        "B", {"lockDuration": SCENARIO_LOCK_MS, "stalledInterval": 500, "paused": True}
    )
    runs: dict[str, int] = {}
    holds: list[float] = []

    async def process(job: Any, token: str) -> str:
        runs[str(job.id)] = runs.get(str(job.id), 0) + 1
        kind = job.data["kind"]
        if kind == "gil":
            holds.append(backtrack(size) * 1000)
        elif kind == "block":
            time.sleep(SCENARIO_BLOCK_S)
        else:
            await asyncio.sleep(0.05)
        return "done"

    kinds = [SCENARIO_PATTERN[i % len(SCENARIO_PATTERN)] for i in range(SCENARIO_JOBS)]
    ids = [one_bench.add_job({"kind": kind}) for kind in kinds]
    started = time.monotonic()
    a = one_bench.start_worker(
        "A",
        process,
        {"lockDuration": SCENARIO_LOCK_MS, "concurrency": 4},
        actor=True,
        isolation="process",
    )
    # Every hold and block runs alone (each stops the whole worker): their sum, and margin.
    budget = kinds.count("gil") * 3 * SCENARIO_HOLD_S + kinds.count("block") * SCENARIO_BLOCK_S
    wait_until(
        lambda: all("finishedOn" in one_bench.job(job_id) for job_id in ids),
        budget + SETTLE_S,
        "every job to finish",
    )
    wait_until(lambda: not a.busy(), SETTLE_S, "worker A to finish")
    twice = sorted((job_id for job_id, count in runs.items() if count > 1), key=int)
    lost = [e.args[0] for e in a.events.of("lockRenewalFailed")]
    OUTCOMES.add(
        "the issue's scenario (process mode)",
        run=run,
        jobs=len(ids),
        ran_twice=len(twice),
        which=twice,
        lost=len(lost),
        stalled=len(checker.stalled_ids()),
        holds_ms=f"{min(holds):.0f}-{max(holds):.0f}",
        seconds=round(time.monotonic() - started, 1),
    )

    assert twice == []
    assert lost == []
    assert checker.stalled_ids() == []
    assert a.events.of("error") == []
    assert sorted(str(e.args[0].id) for e in a.events.of("completed")) == sorted(ids)
