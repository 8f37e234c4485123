"""A bullmq worker killed with its job in hand, in each isolation mode.

The worker (bullmq-py with ``use_actor_lock_manager``) runs in a process of its
own and is SIGKILLed while its processor holds a job. In process mode the
manager's child sees its worker die and deletes the locks it still holds
(compare-and-delete), so a stalled check hands the job on at once; in thread
mode nothing outlives the process, and the lock lives out the TTL it had left.
A second worker (paused: it only checks for stalled jobs) shows the hand-on.
"""

from __future__ import annotations

import signal
import time

import pytest

from tests.bullmq.harness import OUTCOMES, Bench, wait_until
from tests.faults.conftest import FaultRecord

#: The killed worker's lock TTL, by mode. Process mode: long, so the TTL cannot
#: be what removes the lock. Thread mode: short, to show that bound in a short test.
LOCK_MS = {"process": 20_000, "thread": 1_000}
#: The checker's stalled-check interval, in milliseconds.
STALLED_MS = 250
#: Longest wait for a process to start or a job to be taken, in seconds.
SETTLE_S = 30.0


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_killed_bullmq_worker_hands_its_job_on(
    one_bench: Bench, isolation: str, record: FaultRecord
) -> None:
    lock_ms = LOCK_MS[isolation]
    record.fault = f"bullmq worker SIGKILLed with a job in hand ({isolation} mode)"
    record.asserted = (
        "its lock deleted within a quarter of the TTL; the job handed on"
        if isolation == "process"
        else "its lock lives out its TTL; then the job is handed on"
    )
    bench = one_bench
    # Given a worker holding a job far longer than the test,
    a = bench.start_peer(
        "A",
        {"actor": isolation, "hold_s": 3600, "lockDuration": lock_ms, "stalledInterval": 3_600_000},
    )
    job_id = bench.add_job()
    wait_until(a.runs, SETTLE_S, "worker A to hold the job")
    (_, token, _) = a.runs()[0]
    lock = bench.key(job_id, "lock")
    assert bench.client.get(lock) == token
    checker = bench.start_peer(
        "B", {"lockDuration": lock_ms, "stalledInterval": STALLED_MS, "paused": True}
    )
    left_ms = bench.client.pttl(lock)

    # when it is SIGKILLed,
    killed = time.monotonic()
    a.process.send_signal(signal.SIGKILL)
    a.process.wait()
    deadline = SETTLE_S + 2 * lock_ms / 1000
    wait_until(lambda: not bench.client.exists(lock), deadline, "the dead worker's lock gone")
    gone_ms = (time.monotonic() - killed) * 1000
    wait_until(checker.stalled_ids, deadline, "the stalled check to take the job")
    handed_ms = (time.monotonic() - killed) * 1000

    # then the job is handed on: at once in process mode, past the TTL in thread mode.
    assert checker.stalled_ids() == [job_id]
    assert job_id not in bench.client.lrange(bench.key("active"), 0, -1)
    assert job_id in bench.client.lrange(bench.key("wait"), 0, -1)
    if isolation == "process":
        assert gone_ms < lock_ms / 4
    else:
        assert gone_ms >= left_ms - 2
    row = {"lock_gone_ms": round(gone_ms), "handed_on_ms": round(handed_ms), "ttl_ms": lock_ms}
    record.notes = row
    OUTCOMES.add("worker SIGKILLed with a job in hand", isolation=isolation, **row)
