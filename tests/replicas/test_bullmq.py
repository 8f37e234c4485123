"""A bullmq-py worker whose renewals a replica confirms: ``use_actor_lock_manager(replicas=)``."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import TYPE_CHECKING, Any

import pytest
from bullmq import Worker

from actors import Replicas
from actors.bullmq import LOCK_LOST, use_actor_lock_manager
from tests.bullmq.harness import PREFIX, Bench, wait_until
from tests.support.replication import ReplicatedPair

if TYPE_CHECKING:
    from collections.abc import Iterator

    from bullmq.abort_controller import AbortSignal

#: BullMQ's ``lockDuration``, in milliseconds.
LOCK_MS = 2000
#: Longest wait for a worker to take the jobs or finish them, in seconds.
SETTLE_S = 10.0
ISOLATIONS = ["thread", "process"]


@pytest.fixture
def bench(pair: ReplicatedPair) -> Iterator[Bench]:
    pair.attach()
    pair.flush()
    on_pair = Bench(url=pair.primary.url, engine="valkey")
    try:
        yield on_pair
    finally:
        on_pair.close()


def test_a_timeout_longer_than_a_renewal_may_take_is_refused_at_install(
    pair: ReplicatedPair,
) -> None:
    async def scenario() -> None:
        options = {"connection": pair.primary.url, "prefix": PREFIX, "autorun": False}
        worker = Worker("install", None, {**options, "lockDuration": LOCK_MS})
        with pytest.raises(ValueError, match="replicas timeout must be at most"):
            use_actor_lock_manager(worker, replicas=Replicas(1, timeout=LOCK_MS))
        with pytest.raises(TypeError, match="replicas"):
            use_actor_lock_manager(worker, replicas="1")  # type: ignore[arg-type]
        await worker.close()

    asyncio.run(scenario())


def test_replicas_are_checked_with_renewal_off_too(pair: ReplicatedPair) -> None:
    async def scenario() -> None:
        options = {"connection": pair.primary.url, "prefix": PREFIX, "autorun": False}
        worker = Worker("off", None, {**options, "lockDuration": LOCK_MS, "lockRenewTime": 0})
        try:
            with pytest.raises(TypeError, match="replicas"):
                use_actor_lock_manager(worker, replicas="garbage")  # type: ignore[arg-type]
        finally:
            await worker.close()

    asyncio.run(scenario())


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_jobs_renewed_with_the_replicas_confirmation_run_once_to_the_end(
    bench: Bench, isolation: str
) -> None:
    runs: list[str] = []

    async def process(job: Any, token: str, signal: AbortSignal) -> str:
        runs.append(str(job.id))
        await asyncio.sleep(2.5 * LOCK_MS / 1000)  # several renewals
        assert not signal.aborted
        return "done"

    worker = bench.start_worker(
        "A",
        process,
        {"lockDuration": LOCK_MS, "concurrency": 4, "drainDelay": 1},
        actor=True,
        isolation=isolation,
        replicas=1,
    )
    ids = [bench.add_job() for _ in range(4)]
    wait_until(
        lambda: len(worker.events.of("completed")) == 4,
        SETTLE_S + 2.5 * LOCK_MS / 1000,
        "every job to complete",
    )
    assert sorted(runs) == sorted(ids)
    assert not worker.events.of("lockRenewalFailed")
    assert not worker.events.of("error")


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_replica_cut_off_aborts_the_job_before_its_copy_of_the_lock_expires(
    pair: ReplicatedPair, bench: Bench, isolation: str
) -> None:
    started = threading.Event()
    aborted: dict[str, Any] = {}

    async def process(job: Any, token: str, signal: AbortSignal) -> str:
        started.set()
        while not signal.aborted:
            await asyncio.sleep(0.01)
        aborted["at"] = time.monotonic()
        aborted["reason"] = signal.reason
        return "gave up"

    bench.start_worker(
        "A",
        process,
        {"lockDuration": LOCK_MS, "drainDelay": 1},
        actor=True,
        isolation=isolation,
        replicas=1,
    )
    job_id = bench.add_job()
    assert started.wait(SETTLE_S)
    time.sleep(LOCK_MS / 1000)  # past the take's window: renewals the replica confirmed
    pair.detach()
    with pair.replica_client() as replica:
        expires = time.monotonic() + int(replica.pttl(bench.key(job_id, "lock"))) / 1000
    wait_until(lambda: aborted, SETTLE_S, "the job's signal")
    assert aborted["at"] < expires
    assert aborted["reason"].startswith(f"{LOCK_LOST} (unconfirmed)")


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_take_the_replica_did_not_confirm_is_told_to_its_run_at_once(
    pair: ReplicatedPair, bench: Bench, isolation: str
) -> None:
    # A failover may undo a take the replica never saw, and hand the job to
    # another worker at once: the run must not start trusting its lock.
    seen: dict[str, Any] = {}

    async def process(job: Any, token: str, signal: AbortSignal) -> str:
        seen["aborted"], seen["reason"] = signal.aborted, signal.reason
        return "gave up"

    pair.detach()
    bench.start_worker(
        "A",
        process,
        {"lockDuration": LOCK_MS, "drainDelay": 1},
        actor=True,
        isolation=isolation,
        replicas=1,
    )
    job_id = bench.add_job()
    wait_until(lambda: seen, SETTLE_S, "the job's run")
    assert seen["aborted"] is True
    assert seen["reason"] == f"{LOCK_LOST} (unconfirmed): job {job_id}"
