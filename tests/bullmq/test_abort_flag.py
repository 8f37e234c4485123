"""A processor that blocks the loop reads ``signal.aborted`` right after the blocking call.

The README's pattern: a processor renders (blocking the loop), then checks
``signal.aborted`` before committing, with no ``await`` in between. The
manager's delivery thread marks the run's signal as soon as the manager knows
the lock is lost, whatever the loop is doing.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

from actors.bullmq import LOCK_LOST
from tests.bullmq.harness import Bench, wait_until

if TYPE_CHECKING:
    from bullmq.abort_controller import AbortSignal

#: BullMQ's ``lockDuration``, in milliseconds.
LOCK_MS = 1000
#: Longest wait for a worker to take the job or finish it, in seconds.
SETTLE_S = 10.0


def test_the_signal_reads_aborted_right_after_a_call_that_blocked_the_loop(bench: Bench) -> None:
    started = threading.Event()
    seen: dict[str, Any] = {}

    async def process(job: Any, token: str, signal: AbortSignal) -> str:
        started.set()
        time.sleep(3 * LOCK_MS / 1000)  # render(job.data): blocks the loop
        seen["aborted"] = signal.aborted  # no await since the block
        seen["reason"] = signal.reason
        return "done"

    a = bench.start_worker("A", process, {"lockDuration": LOCK_MS}, actor=True)
    job_id = bench.add_job()
    assert started.wait(SETTLE_S)
    # When another holder takes the lock half a second into the blocking call
    time.sleep(0.5)
    bench.client.set(bench.key(job_id, "lock"), "thief", px=10 * LOCK_MS)
    # Then the check right after the blocking call sees it
    wait_until(lambda: "aborted" in seen, SETTLE_S + 3 * LOCK_MS / 1000, "the processor's check")
    assert seen == {"aborted": True, "reason": f"{LOCK_LOST} (stolen): job {job_id}"}
    # and once the loop runs, the loss is reported as bullmq-py reports it
    wait_until(lambda: a.events.of("lockRenewalFailed"), SETTLE_S, "the event")
    assert bench.client.get(bench.key(job_id, "lock")) == "thief"
    wait_until(lambda: not a.busy(), SETTLE_S, "the worker to finish with the job")
