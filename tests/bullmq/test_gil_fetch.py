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

from typing import TYPE_CHECKING, Any

import pytest

from tests.bullmq.burn import backtrack, size_for
from tests.bullmq.harness import OUTCOMES, Bench, wait_until
from tests.bullmq.slowlink import slow_link

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
