"""Generated schedules: any concurrency, loop blocks at random moments, every job runs once.

Each example runs worker A (bullmq-py with ``use_actor_lock_manager``, in each
isolation mode in turn) at a
drawn concurrency over a drawn set of jobs: async work of random length, some
jobs moving themselves to delayed first, and some processors blocking the
loop with ``time.sleep`` for up to three lock durations at a drawn moment
(at the start, at the end, right after moving to delayed); in process mode
some of them hold the GIL instead (a catastrophic regular expression), so the
jobs fetched beside them are fetched while nothing in the worker runs. Worker B, a stock
worker in a process of its own, takes no jobs and checks for stalled ones
twice per lock duration. Whatever the schedule: every job completes exactly
once, nothing is stalled, no lock is reported lost, no move is refused, and
nothing is left in ``active``.

CI runs a few examples per engine; ``make fuzz`` runs more
(``BULLMQ_EXAMPLES``).
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from dataclasses import dataclass
from typing import Any

import pytest
from bullmq.custom_errors import DelayedError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.bullmq.burn import backtrack, size_for
from tests.bullmq.harness import OUTCOMES, Bench, wait_until

#: BullMQ's ``lockDuration``, in milliseconds; renewal every half of it.
LOCK_MS = 1000
#: Examples per engine.
EXAMPLES = int(os.environ.get("BULLMQ_EXAMPLES", "3"))
#: Most processors that block the loop in one example (each blocks up to 3 locks).
MOST_BLOCKERS = 2
#: Longest wait for every job to finish, in seconds, past the blocks themselves.
SETTLE_S = 15.0

#: Worker B: checks for stalled jobs twice per lock duration, takes none itself.
CHECKER = {"lockDuration": LOCK_MS, "stalledInterval": LOCK_MS // 2, "paused": True}


@dataclass(frozen=True)
class Plan:
    """What one job's processor does."""

    #: Async work, in milliseconds (the loop stays free).
    work_ms: int
    #: Move itself to delayed on its first attempt, then raise ``DelayedError``.
    delays: bool
    #: Where the processor blocks the loop: "start", "end", "after_move" or "".
    block_at: str
    #: How long it blocks, in milliseconds.
    block_ms: int
    #: In process mode, hold the GIL for that long instead of sleeping.
    gil: bool = False


blocks = st.sampled_from([LOCK_MS // 2, LOCK_MS, 2 * LOCK_MS, 3 * LOCK_MS])


@st.composite
def plans(draw: st.DrawFn) -> list[Plan]:
    count = draw(st.integers(1, 8))
    drawn = []
    for _ in range(count):
        delays = draw(st.booleans())
        moments = ["", "start", "end", *(["after_move"] if delays else [])]
        drawn.append(
            Plan(
                work_ms=draw(st.sampled_from([0, 20, 150, 600])),
                delays=delays,
                block_at=draw(st.sampled_from(moments)),
                block_ms=draw(blocks),
                gil=draw(st.booleans()),
            )
        )
    # At most a few blockers: each one holds the whole worker up.
    blockers = [i for i, plan in enumerate(drawn) if plan.block_at]
    for i in blockers[MOST_BLOCKERS:]:
        drawn[i] = Plan(drawn[i].work_ms, drawn[i].delays, "", 0)
    return drawn


#: The match size that holds the GIL about half a lock duration here (calibrated once).
_HALF_LOCK_SIZE: list[int] = []


def hold(plan: Plan, isolation: str) -> None:
    """Block the loop for the plan's time: hold the GIL in process mode if the plan says so.

    (In thread mode a GIL hold past the trust window loses the lock by design: see test_gil.)
    """
    if not (plan.gil and isolation == "process"):
        time.sleep(plan.block_ms / 1000)
        return
    if not _HALF_LOCK_SIZE:
        _HALF_LOCK_SIZE.append(size_for(LOCK_MS / 2 / 1000))
    # Each step of the size doubles the time: 0.5, 1, 2 and 3 (about 4) lock durations.
    backtrack(_HALF_LOCK_SIZE[0] + round(math.log2(plan.block_ms / (LOCK_MS / 2))))


def run_schedule(bench: Bench, concurrency: int, schedule: list[Plan], isolation: str) -> None:
    runs: dict[str, list[int]] = {}

    async def process(job: Any, token: str) -> str:
        plan = schedule[job.data["plan"]]
        attempt = len(runs.setdefault(str(job.id), [])) + 1
        runs[str(job.id)].append(attempt)
        if plan.block_at == "start" and attempt == 1:
            hold(plan, isolation)
        await asyncio.sleep(plan.work_ms / 1000)
        if plan.delays and attempt == 1:
            await job.moveToDelayed(int(time.time() * 1000) + 50, token)
            if plan.block_at == "after_move":
                hold(plan, isolation)
            raise DelayedError()
        if plan.block_at == "end":
            hold(plan, isolation)
        return "done"

    ids = [bench.add_job({"plan": i}) for i in range(len(schedule))]
    # In process mode the GIL holds burn a core the child shares: its locks get the
    # margin of a loaded machine (the holds stay as long, in milliseconds).
    lock_ms = 2 * LOCK_MS if isolation == "process" else LOCK_MS
    options = {"lockDuration": lock_ms, "concurrency": concurrency}
    started = time.monotonic()
    a = bench.start_worker(f"A{ids[0]}", process, options, actor=True, isolation=isolation)
    # A GIL hold may last twice its nominal time (the match's size is a power of two).
    blocked_s = 2 * sum(plan.block_ms for plan in schedule if plan.block_at) / 1000
    try:
        wait_until(
            lambda: all("finishedOn" in bench.job(job_id) for job_id in ids),
            blocked_s + SETTLE_S,
            "every job to finish",
        )
        wait_until(lambda: not a.busy(), SETTLE_S, "worker A to finish")
    finally:
        a.close()
    elapsed = time.monotonic() - started

    # Every job ran once (twice when it moved itself to delayed first),
    assert {job_id: runs.get(job_id) for job_id in ids} == {
        job_id: ([1, 2] if schedule[i].delays else [1]) for i, job_id in enumerate(ids)
    }
    # and completed once: nothing stalled, nothing lost, no move refused,
    completed = sorted(str(event.args[0].id) for event in a.events.of("completed"))
    assert completed == sorted(ids)
    assert a.events.of("failed") == []
    assert a.events.of("stalled") == []
    assert a.events.of("lockRenewalFailed") == []
    assert a.events.of("error") == []
    for job_id in ids:
        job = bench.job(job_id)
        assert job.get("stc", "0") == "0", job_id
        assert "returnvalue" in job, job_id
    # and nothing is left active.
    assert bench.client.llen(bench.key("active")) == 0

    OUTCOMES.add(
        "generated schedules",
        engine=bench.engine,
        isolation=isolation,
        concurrency=concurrency,
        jobs=len(ids),
        delayed=sum(plan.delays for plan in schedule),
        blocked_ms=[plan.block_ms for plan in schedule if plan.block_at],
        gil=[plan.gil and isolation == "process" for plan in schedule if plan.block_at],
        block_at=[plan.block_at for plan in schedule if plan.block_at],
        runs=sum(len(r) for r in runs.values()),
        stalled=0,
        lost=0,
        seconds=round(elapsed, 1),
    )


@pytest.mark.parametrize("isolation", ["thread", "process"])
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(concurrency=st.integers(1, 8), schedule=plans())
def test_every_job_runs_once_whatever_blocks_the_loop(
    bench: Bench, isolation: str, concurrency: int, schedule: list[Plan]
) -> None:
    # One queue and one stalled checker serve every example of the engine.
    if not bench.peers():
        bench.start_peer("B", CHECKER)
    run_schedule(bench, concurrency, schedule, isolation)
    (checker,) = bench.peers()
    assert checker.stalled_ids() == []
    assert checker.runs() == []
