"""A lock taken behind the worker's back reaches the processor through its AbortSignal.

The manager renews each lock once per ``lock_renew_time`` (every second tick),
so a stolen lock is found at the job's next renewal attempt. Stolen between
two renewals, after the tick that skipped the job, the signal is aborted
within one tick interval; stolen just after a renewal, within one renewal
period (plus half an interval for a late tick).
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import TYPE_CHECKING, Any

import pytest
from bullmq import Worker

from actors import get_stats, get_tracked_job_ids
from actors.bullmq import LOCK_LOST, use_actor_lock_manager
from actors.connection import client_for_url
from actors.embedded import free_port
from tests.bullmq.harness import (
    OUTCOMES,
    PREFIX,
    Bench,
    Event,
    LoopThread,
    WorkerEvents,
    wait_until,
)

if TYPE_CHECKING:
    from bullmq.abort_controller import AbortSignal

pytestmark = pytest.mark.both_engines

#: BullMQ's ``lockDuration``, in milliseconds.
LOCK_MS = 1000
#: bullmq's default ``lockRenewTime``: half the lock duration.
RENEW_MS = LOCK_MS // 2
#: The manager's tick interval.
INTERVAL_MS = RENEW_MS // 2
#: Longest wait for a worker to take the job or for a first renewal, in seconds.
SETTLE_S = 10.0


def renewed(job_id: str) -> Any:
    def match(event: Event) -> bool:
        return job_id in event.args[0]["jobIds"]

    return match


@pytest.mark.parametrize("phase", ["between_renewals", "after_renewal"])
def test_stolen_lock_aborts_the_processors_signal(bench: Bench, phase: str) -> None:
    started = threading.Event()
    aborted = threading.Event()
    seen: dict[str, Any] = {}

    async def process(job: Any, token: str, signal: AbortSignal) -> str:
        seen["token"] = token
        started.set()
        await asyncio.wait_for(signal.wait(), SETTLE_S)
        seen["aborted_at"] = time.monotonic()
        seen["reason"] = signal.reason
        aborted.set()
        return "aborted"

    # Given a job held by a worker whose locks our manager renews,
    a = bench.start_worker("A", process, {"lockDuration": LOCK_MS}, actor=True)
    job_id = bench.add_job()
    assert started.wait(SETTLE_S)
    lock_key = bench.key(job_id, "lock")
    # and a renewal of its lock, seen through bullmq's own event.
    last = a.events.wait("locksRenewed", renewed(job_id), SETTLE_S)
    assert last.args == ({"count": 1, "jobIds": [job_id]},)

    # When another holder takes the lock (a watched lock is renewed at every
    # tick): half way between two ticks,
    if phase == "between_renewals":
        steal_at = last.at + 0.5 * INTERVAL_MS / 1000
        time.sleep(max(0.0, steal_at - time.monotonic()))
        bound_ms = INTERVAL_MS
    # or right after a renewal, so a whole interval passes before the next attempt.
    else:
        bound_ms = INTERVAL_MS + INTERVAL_MS // 2
    stolen_at = time.monotonic()
    bench.client.set(lock_key, "thief", px=LOCK_MS)

    # Then the processor's signal is aborted within the bound, saying why,
    assert aborted.wait(SETTLE_S), "the signal was never aborted"
    delay_ms = (seen["aborted_at"] - stolen_at) * 1000
    assert delay_ms <= bound_ms, f"{delay_ms:.0f} ms > {bound_ms} ms"
    assert seen["reason"] == f"{LOCK_LOST} (stolen): job {job_id}"
    # and the worker emitted what bullmq-py emits for a failed renewal,
    (failed,) = a.events.of("lockRenewalFailed")
    assert failed.args == ([job_id],)
    errors = [str(e.args[0]) for e in a.events.of("error")]
    assert f"could not renew lock for job {job_id}" in errors
    # and nobody touched the new holder's lock.
    assert bench.client.get(lock_key) == "thief"
    assert a.lock_manager is not None
    manager = a.lock_manager.manager
    assert manager is not None
    assert get_stats(manager, timeout=5).lost == 1
    wait_until(lambda: not a.busy(), SETTLE_S, "the worker to finish with the job")

    OUTCOMES.add(
        "stolen lock", engine=bench.engine, steal=phase, abort_ms=round(delay_ms), bound_ms=bound_ms
    )


def test_cancel_job_aborts_the_signal_and_unknown_jobs_are_refused(bench: Bench) -> None:
    started = threading.Event()
    reasons: list[str | None] = []

    async def process(job: Any, token: str, signal: AbortSignal) -> str:
        started.set()
        await asyncio.wait_for(signal.wait(), SETTLE_S)
        reasons.append(signal.reason)
        return "cancelled"

    a = bench.start_worker("A", process, {"lockDuration": LOCK_MS}, actor=True)
    job_id = bench.add_job()
    assert started.wait(SETTLE_S)

    async def cancel() -> tuple[bool, bool]:
        return a.worker.cancelJob("no-such-job"), a.worker.cancelJob(job_id, "operator")

    # When the worker cancels the job (bullmq's Worker.cancelJob),
    assert a.loop.call(cancel) == (False, True)
    # then the processor sees the caller's reason, and the job completes normally.
    wait_until(lambda: a.events.of("completed"), SETTLE_S, "the job to complete")
    assert reasons == ["operator"]
    assert a.events.of("lockRenewalFailed") == []


@pytest.mark.parametrize("meanwhile", ["finished", "taken_again"])
def test_a_report_about_a_lock_the_worker_let_go_is_dropped(bench: Bench, meanwhile: str) -> None:
    # A report reaches the loop only when the loop is free. By then the worker
    # may have finished the job (its move to completed deletes the lock) or
    # taken it again with a new token: the report is about the past. The old
    # run's signal said so at once (its lock was lost while it ran); no event
    # is emitted, and a new run's signal is not touched.
    loop = LoopThread("bullmq-reports")
    events = WorkerEvents()
    try:

        async def scenario() -> tuple[bool, bool, list[str]]:
            options = {"connection": bench.url, "prefix": PREFIX, "autorun": False}
            worker = Worker(bench.queue, None, {**options, "lockDuration": LOCK_MS})
            events.listen(worker, "lockRenewalFailed", "error")
            installed = use_actor_lock_manager(worker)
            installed.start()
            assert installed.manager is not None
            lock_key = bench.key("7", "lock")
            bench.client.set(lock_key, "old-token", px=LOCK_MS)
            controller = installed.track_job("7", "old-token", time.time_ns() // 1_000_000, True)
            assert controller is not None
            bench.client.set(lock_key, "thief", px=LOCK_MS)
            # Hold the loop until the manager has found the loss and sent word
            # (its delivery thread aborts the signal, the loop is told later),
            manager = installed.manager
            wait_until(
                lambda: get_stats(manager, timeout=5).lost == 1 and controller.signal.aborted,
                SETTLE_S,
                "the loss",
            )
            # and let go of the job before the word is read.
            installed.untrack_job("7")
            new = None
            if meanwhile == "taken_again":
                new = installed.track_job("7", "new-token", time.time_ns() // 1_000_000, True)
            for _ in range(3):
                await asyncio.sleep(0)
            tracked = installed.get_tracked_job_ids()
            await worker.close()
            return controller.signal.aborted, new is not None and new.signal.aborted, tracked

        aborted, new_aborted, tracked = loop.call(scenario)
    finally:
        loop.close()

    assert events.of("lockRenewalFailed") == []
    assert events.of("error") == []
    assert aborted
    assert not new_aborted
    assert tracked == ([] if meanwhile == "finished" else ["7"])


@pytest.mark.parametrize("outcome", ["completed", "failed"])
def test_the_job_stays_tracked_until_bullmq_has_moved_it(bench: Bench, outcome: str) -> None:
    # bullmq moves a finished job (deleting its lock) and then untracks it.
    # Until the server has run the move, the lock is the run's and must be
    # renewed; once it has, the manager lets go, and nothing is reported lost.
    seen: list[list[str]] = []

    async def process(job: Any, token: str) -> str:
        if outcome == "failed":
            raise RuntimeError("the job fails")
        return "done"

    a = bench.start_worker("A", process, {"lockDuration": LOCK_MS}, actor=True)
    installed = a.lock_manager
    assert installed is not None

    async def observe() -> None:
        # Look at the manager's jobs at the moment bullmq moves the job.
        backend = a.worker.backend
        move = getattr(backend, f"moveTo{outcome.capitalize()}")

        async def observed(*args: Any, **kwargs: Any) -> Any:
            assert installed.manager is not None
            seen.append(get_tracked_job_ids(installed.manager, timeout=5))
            return await move(*args, **kwargs)

        setattr(backend, f"moveTo{outcome.capitalize()}", observed)

    a.loop.call(observe)
    job_id = bench.add_job()
    a.events.wait(outcome, lambda event: str(event.args[0].id) == job_id, SETTLE_S)

    assert seen == [[job_id]]
    assert installed.manager is not None
    manager = installed.manager
    wait_until(lambda: get_tracked_job_ids(manager, timeout=5) == [], SETTLE_S, "the untrack")
    assert a.events.of("lockRenewalFailed") == []


def test_a_job_whose_renewals_go_unanswered_is_aborted_before_its_lock_can_expire(
    bench: Bench,
) -> None:
    # Given a worker whose renewal client reaches no server (its own connection
    # does, so it takes the job),
    seen: dict[str, Any] = {}

    async def process(job: Any, token: str, signal: AbortSignal) -> str:
        seen["token"] = token
        await asyncio.wait_for(signal.wait(), SETTLE_S)
        # (read at once: the lock must still be there, held by this run)
        seen["pttl"] = int(bench.client.pttl(bench.key(str(job.id), "lock")))
        seen["value"] = bench.client.get(bench.key(str(job.id), "lock"))
        seen["reason"] = signal.reason
        return "stopped"

    # (bounded as the client the integration builds is: a failed tick is short)
    nobody = client_for_url(f"redis://127.0.0.1:{free_port()}/0", timeout=INTERVAL_MS / 4000)
    a = bench.start_worker(
        "A", process, {"lockDuration": LOCK_MS}, actor=True, connection_for_renewal=nobody
    )
    job_id = bench.add_job()

    # When no renewal is confirmed, the run is told "unconfirmed" at its
    # deadline: before the server can expire the lock another worker would take.
    a.events.wait("lockRenewalFailed", lambda event: job_id in event.args[0], SETTLE_S)
    wait_until(lambda: "reason" in seen, SETTLE_S, "the processor to hear of it")
    assert seen["reason"] == f"{LOCK_LOST} (unconfirmed): job {job_id}"
    assert seen["value"] == seen["token"]
    assert seen["pttl"] > 0
    assert len(a.events.of("lockRenewalFailed")) == 1
    nobody.close()


def test_two_locks_lost_at_one_tick_are_one_event(bench: Bench) -> None:
    # bullmq-py emits lockRenewalFailed once per failed renewal, with every id it lost
    started: list[str] = []
    both = threading.Event()

    async def process(job: Any, token: str, signal: AbortSignal) -> str:
        started.append(str(job.id))
        if len(started) == 2:
            both.set()
        await asyncio.wait_for(signal.wait(), SETTLE_S)
        return "aborted"

    a = bench.start_worker("A", process, {"lockDuration": LOCK_MS, "concurrency": 2}, actor=True)
    jobs = [bench.add_job(), bench.add_job()]
    assert both.wait(SETTLE_S)
    a.events.wait("locksRenewed", lambda e: e.args[0]["count"] == 2, SETTLE_S)
    # When both locks are taken behind the worker's back at once
    pipe = bench.client.pipeline()
    for job_id in jobs:
        pipe.set(bench.key(job_id, "lock"), "thief", px=LOCK_MS)
    pipe.execute()
    wait_until(
        lambda: (
            sorted(i for e in a.events.of("lockRenewalFailed") for i in e.args[0]) == sorted(jobs)
        ),
        SETTLE_S,
        "both losses",
    )
    # Then bullmq-py's one event per tick, listing both (unless the steal fell between two ticks)
    assert [sorted(e.args[0]) for e in a.events.of("lockRenewalFailed")] == [sorted(jobs)]
