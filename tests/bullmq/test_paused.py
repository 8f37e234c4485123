"""A bullmq worker paused as its run starts: ``signal.aborted`` reads the run's deadline itself.

Worker A (bullmq-py with ``use_actor_lock_manager``, a process of its own)
takes a job, and its processor stops the whole process (SIGSTOP) before its
first look at ``signal.aborted``. Nothing of A runs meanwhile: in thread mode
not the manager's timer nor its renewal, so the lock lives out its TTL and
another worker takes the job. Once continued, the processor's first look,
before any ``await``, must read the lock lost: the manager may not have run
yet, so the signal reads the lock's deadline (DESIGN.md, "Abort before
steal"). In process mode the manager's child renews through the pause, and
the same look reads the lock held.
"""

from __future__ import annotations

import signal
import time

from actors.bullmq import LOCK_LOST
from tests.bullmq.harness import Bench, PeerWorker, wait_until

#: BullMQ's ``lockDuration``, in milliseconds.
LOCK_MS = 1000
#: Longest wait for a process to start, take a job, or look at its signal, in seconds.
SETTLE_S = 30.0
#: Worker A: renewed by ``use_actor_lock_manager``; no stalled check of its own.
OPTIONS = {"lockDuration": LOCK_MS, "stalledInterval": 3_600_000, "stop_at_start": True}


def paused_run(bench: Bench, isolation: str) -> tuple[PeerWorker, str, str]:
    """Start A, give it a job, and return once its run has stopped the process."""
    a = bench.start_peer("A", {"actor": isolation, **OPTIONS})
    job_id = bench.add_job()
    wait_until(a.stopped, SETTLE_S, "worker A to stop as its run starts")
    lock = bench.key(job_id, "lock")
    token = bench.client.get(lock)
    assert token is not None, "A stopped without the job's lock"
    return a, job_id, str(token)


def first_look(a: PeerWorker) -> tuple[str, bool, str]:
    """Continue A; return what its run's first look at the signal read."""
    a.process.send_signal(signal.SIGCONT)
    wait_until(a.reads, SETTLE_S, "A's run to look at its signal")
    [read] = a.reads()
    return read


def test_a_run_paused_past_its_deadline_reads_aborted_at_its_first_look(one_bench: Bench) -> None:
    bench = one_bench
    # Given a run whose process stopped as it started (thread mode: nothing renews),
    a, job_id, token = paused_run(bench, "thread")
    lock = bench.key(job_id, "lock")
    # when its lock lives out its TTL and another worker takes the job,
    wait_until(
        lambda: not bench.client.exists(lock), LOCK_MS / 1000 + SETTLE_S, "A's lock to expire"
    )
    bench.client.set(lock, "another-worker", px=60 * LOCK_MS)

    # then once continued, its first look reads the lock lost: its deadline passed.
    assert first_look(a) == (token, True, f"{LOCK_LOST} (unconfirmed): job {job_id}")


def test_in_process_mode_a_paused_run_reads_its_lock_held(one_bench: Bench) -> None:
    bench = one_bench
    # Given a run whose process stopped as it started, its lock renewed by the child,
    a, job_id, token = paused_run(bench, "process")
    lock = bench.key(job_id, "lock")
    # when the pause lasts two lock durations, the lock held by the child throughout,
    until = time.monotonic() + 2 * LOCK_MS / 1000
    while time.monotonic() < until:
        assert bench.client.get(lock) == token and bench.client.pttl(lock) > 0
        time.sleep(LOCK_MS / 1000 / 20)

    # then once continued, its first look reads the lock held: the child confirmed
    # renewals meanwhile, and the signal's deadline follows them.
    assert first_look(a) == (token, False, "None")
