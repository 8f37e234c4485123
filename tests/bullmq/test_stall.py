"""A processor that blocks its worker's loop for three lock durations, judged by BullMQ.

Worker A (bullmq-py, on its own loop thread) takes the job; its processor
blocks the loop with ``time.sleep`` or a pure-Python CPU loop. Worker B (a
process of its own, as a second worker is) runs bullmq's stalled-jobs check
every ``STALLED_MS`` and takes whatever is moved back to wait. The test's
thread samples the lock key throughout.

- bullmq-py's own lock manager renews on A's loop, so the lock expires, B's
  check moves the job back, and B runs it a second time.
- With ``use_actor_lock_manager`` the lock is renewed from a thread: it never
  expires, no check stalls it, and A completes it once.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest

from actors import get_stats
from tests.bullmq.harness import (
    BLOCKERS,
    OUTCOMES,
    Bench,
    PeerWorker,
    RunningWorker,
    Sample,
    longest_gap_ms,
    sample_lock,
    wait_until,
)

if TYPE_CHECKING:
    from bullmq.abort_controller import AbortSignal

pytestmark = pytest.mark.both_engines

#: BullMQ's ``lockDuration``, in milliseconds; renewal every half of it.
LOCK_MS = 1000
#: BullMQ's ``stalledInterval``, in milliseconds: two checks per lock duration.
STALLED_MS = LOCK_MS // 2
#: How long the processor blocks its loop, in seconds.
BLOCK_S = 3 * LOCK_MS / 1000
#: Longest wait for a worker to take the job or finish with it, in seconds.
SETTLE_S = 10.0

OPTIONS = {"lockDuration": LOCK_MS, "stalledInterval": STALLED_MS, "maxStalledCount": 1}


@dataclass
class Hold:
    """What happened to one job whose processor blocked its loop."""

    job_id: str
    #: The token of A's lock.
    token: str
    #: Who ran the job, in order, with the token and the monotonic start time.
    runs: list[tuple[str, str, float]]
    #: When A's processor stopped blocking, on the monotonic clock.
    unblocked_at: float
    samples: list[Sample]
    #: The job's hash after both workers were done with it.
    job: dict[str, str]
    a: RunningWorker
    b: PeerWorker

    @property
    def who(self) -> list[str]:
        return [name for name, _, _ in self.runs]

    def stalled_ids(self) -> list[str]:
        return [str(event.args[0]) for event in self.a.events.of("stalled")] + self.b.stalled_ids()

    def checks_after_expiry(self) -> int:
        """Stalled checks that ran when A's lock, unless renewed, was gone."""
        processed_on = int(self.job["processedOn"])
        stamps = {int(s.check) for s in self.samples if s.check is not None}
        return sum(1 for stamp in stamps if stamp > processed_on + LOCK_MS)


def hold(bench: Bench, blocker: str, *, actor: bool) -> Hold:
    runs: list[tuple[str, str, float]] = []
    started = threading.Event()
    unblocked = threading.Event()
    unblocked_at: list[float] = []

    async def process_a(job: Any, token: str, signal: AbortSignal) -> str:
        runs.append(("A", token, time.monotonic()))
        started.set()
        expired_at = time.time() * 1000 + LOCK_MS
        blocked_until = time.monotonic() + BLOCK_S
        checks: set[int] = set()
        try:
            # Blocked for BLOCK_S, and on a loaded machine until B's stalled check
            # ran twice past the lock's unrenewed expiry (what would take the job).
            while time.monotonic() < blocked_until + SETTLE_S and (
                time.monotonic() < blocked_until or len(checks) < 2
            ):
                BLOCKERS[blocker](0.05)
                stamp = bench.client.get(bench.key("stalled-check"))
                if stamp is not None and int(stamp) > expired_at:
                    checks.add(int(stamp))
        finally:
            unblocked_at.append(time.monotonic())
            unblocked.set()
        return "A"

    # Given worker A holding the job, and then worker B checking for stalls.
    a = bench.start_worker("A", process_a, OPTIONS, actor=actor)
    job_id = bench.add_job()
    assert started.wait(SETTLE_S), "worker A did not take the job"
    token = runs[0][1]
    b = bench.start_peer("B", OPTIONS)

    # When A's processor blocks its loop, while the test watches the lock.
    samples = sample_lock(
        bench.client,
        bench.key(job_id, "lock"),
        bench.key("stalled-check"),
        unblocked,
        BLOCK_S + SETTLE_S,
    )
    wait_until(lambda: not a.busy(), SETTLE_S, "worker A to finish with the job")
    wait_until(lambda: "finishedOn" in bench.job(job_id), SETTLE_S, "the job to finish")
    runs = sorted(runs + b.runs(), key=lambda run: run[2])
    return Hold(job_id, token, runs, unblocked_at[0], samples, bench.job(job_id), a, b)


@pytest.mark.parametrize("blocker", ["sleep", "cpu"])
def test_stock_bullmq_loses_the_lock_and_runs_the_job_twice(bench: Bench, blocker: str) -> None:
    result = hold(bench, blocker, actor=False)

    # Then the lock was gone while A still ran: nothing renewed it.
    gap = longest_gap_ms(result.samples, result.token)
    assert any(sample.pttl == -2 for sample in result.samples)
    assert gap > 0
    # and B's check found the job stalled and moved it back to wait,
    assert result.stalled_ids() == [result.job_id]
    assert result.job["stc"] == "1"
    # and B ran it a second time while A was still blocked,
    assert result.who == ["A", "B"]
    assert result.runs[1][2] < result.unblocked_at
    assert result.job["ats"] == "2"
    # and B's result is the job's: A's work was done for nothing.
    assert json.loads(result.job["returnvalue"]) == "B"
    assert result.a.events.of("completed") == []

    OUTCOMES.add(
        "blocked loop",
        engine=bench.engine,
        blocker=blocker,
        renewal="bullmq-py",
        runs=len(result.runs),
        stalled=len(result.stalled_ids()),
        attemptsStarted=result.job["ats"],
        lock_gap_ms=round(gap),
        min_pttl_ms=min((s.pttl for s in result.samples if s.value == result.token), default=None),
        result=json.loads(result.job["returnvalue"]),
    )


@pytest.mark.parametrize("blocker", ["sleep", "cpu"])
def test_actor_lock_manager_keeps_the_lock_and_runs_the_job_once(
    bench: Bench, blocker: str
) -> None:
    result = hold(bench, blocker, actor=True)
    assert result.a.lock_manager is not None
    manager = result.a.lock_manager.manager
    assert manager is not None
    stats = get_stats(manager, timeout=5)

    # Then A's lock held A's token at every sample, and never ran out,
    assert all(s.value == result.token and s.pttl > 0 for s in result.samples)
    min_pttl = min(s.pttl for s in result.samples)
    assert min_pttl > 0
    # although B's checks ran when the lock would have expired without renewal,
    assert result.checks_after_expiry() >= 2
    # so no check stalled the job: A ran it once and completed it.
    assert result.stalled_ids() == []
    assert result.job.get("stc", "0") == "0"
    assert result.who == ["A"]
    assert result.job["ats"] == "1"
    assert json.loads(result.job["returnvalue"]) == "A"
    assert [str(e.args[0].id) for e in result.a.events.of("completed")] == [result.job_id]
    assert result.a.events.of("lockRenewalFailed") == []
    assert stats.lost == 0
    assert stats.renewed >= int(BLOCK_S * 1000 // (LOCK_MS // 2)) - 1

    OUTCOMES.add(
        "blocked loop",
        engine=bench.engine,
        blocker=blocker,
        renewal="actors",
        runs=len(result.runs),
        stalled=len(result.stalled_ids()),
        attemptsStarted=result.job["ats"],
        lock_gap_ms=round(longest_gap_ms(result.samples, result.token)),
        min_pttl_ms=min_pttl,
        result=json.loads(result.job["returnvalue"]),
        max_tick_lateness_ms=round(getattr(stats, "max_tick_lateness_ms", float("nan")), 1),
        min_lock_margin_ms=getattr(stats, "min_lock_margin_ms", None),
    )
