"""A run's whole life under ``use_actor_lock_manager``, at its edges.

Every job is renewed from the fetch that takes its lock until bullmq's move
of it is answered, a close racing a fetch included; a run whose job this
worker takes again has its signal aborted; a job fetched but given up before
its processor starts is let go; closing the worker never hangs on a stalled
server and leaves no thread behind, however often it is called. The stock
worker runs beside some of these, to show where it copes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
import time
from typing import TYPE_CHECKING, Any

import pytest
import redis.asyncio
from bullmq import Worker
from bullmq.redis_connection import SCRIPT_DEFINITIONS, loadScript

from actors.bullmq import LOCK_LOST, use_actor_lock_manager
from tests.bullmq.harness import PREFIX, Bench, LoopThread, close_worker, wait_until

if TYPE_CHECKING:
    from bullmq.abort_controller import AbortSignal

#: BullMQ's ``lockDuration``, in milliseconds, for the short-lock tests.
LOCK_MS = 1000
#: Longest wait for a worker to take a job or finish one, beyond the work itself.
SETTLE_S = 10.0


def lock_seconds(count: float) -> float:
    """``count`` lock durations, in seconds."""
    return count * LOCK_MS / 1000


def clients_blocked_in(bench: Bench, *commands: str) -> int:
    """How many clients the server holds blocked in one of ``commands`` (a pause, a pop)."""
    return sum(
        1
        for entry in bench.client.client_list()
        if entry.get("cmd") in commands and "b" in str(entry.get("flags", ""))
    )


def test_a_job_fetched_while_the_worker_closes_keeps_its_lock(one_bench: Bench) -> None:
    # bullmq's graceful close waits for the tasks it has at that moment (a
    # fetch among them), then closes the lock manager; the job that fetch
    # takes is processed after all, by run(), with the manager closed.
    bench = one_bench
    closing: list[asyncio.Future[Any]] = []

    async def process(job: Any, token: str) -> str:
        if job.data.get("role") == "closer":
            # The worker's second fetch (job "slow") is already under way.
            closing.append(asyncio.ensure_future(job.queue.close()))
            return "closed"
        await asyncio.sleep(lock_seconds(3))
        return "done"

    closer = bench.add_job({"role": "closer"})
    slow = bench.add_job({"role": "slow"})
    a = bench.start_worker("A", process, {"lockDuration": LOCK_MS, "concurrency": 2}, actor=True)
    # The slow job's run ends: completed, or its moves refused (the worker
    # then emits "error" and leaves the job active).
    wait_until(
        lambda: "finishedOn" in bench.job(slow) or a.events.of("error"),
        lock_seconds(3) + SETTLE_S,
        "the slow job's run to end",
    )
    # It kept its lock all along, and completed.
    errors = [str(e.args[0]) for e in a.events.of("error")]
    assert errors == [], f"the job fetched during the close lost its lock: {errors}"
    assert bench.job(slow).get("returnvalue") == '"done"'
    assert "finishedOn" in bench.job(closer)


def test_a_run_whose_job_is_taken_again_by_the_same_worker_is_aborted(
    one_bench: Bench,
) -> None:
    # A job whose run lost it (a stalled check handed it back to wait) and
    # that this very worker takes again: the new run's lock overwrites the old
    # run's, so the old run's lock is stolen. Its processor must hear so.
    bench = one_bench
    first: dict[str, Any] = {}
    started = threading.Event()
    second = threading.Event()

    async def process(job: Any, token: str, signal: AbortSignal) -> str:
        if started.is_set():
            second.set()
            return "second"
        first["token"] = token
        started.set()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(signal.wait(), lock_seconds(3))
        first["aborted"] = signal.aborted
        first["reason"] = signal.reason
        return "first"

    bench.start_worker("A", process, {"lockDuration": LOCK_MS, "concurrency": 2}, actor=True)
    job_id = bench.add_job()
    assert started.wait(SETTLE_S)
    wait_until(lambda: clients_blocked_in(bench, "bzpopmin"), SETTLE_S, "A's free slot to wait")

    # What bullmq's stalled check does to a job whose lock it found gone:
    # back to wait, with a marker; A's free slot takes it at once.
    pipe = bench.client.pipeline(transaction=True)
    pipe.lrem(bench.key("active"), 1, job_id)
    pipe.rpush(bench.key("wait"), job_id)
    pipe.zadd(bench.key("marker"), {"0": 0})
    pipe.execute()
    assert second.wait(SETTLE_S), "A did not take the job again"
    assert bench.client.get(bench.key(job_id, "lock")) != first["token"]

    wait_until(lambda: "aborted" in first, lock_seconds(3) + SETTLE_S, "the first run to end")
    assert first["aborted"], "the first run's lock was stolen and its signal never aborted"
    assert str(first["reason"]).startswith(LOCK_LOST)


@pytest.mark.parametrize("actor", [None, "thread", "process"], ids=["stock", "actor", "process"])
def test_force_close_returns_while_a_fetch_waits_on_a_paused_server(
    one_bench: Bench, actor: str | None
) -> None:
    # A long lock (bullmq's default is 30 s; long jobs use minutes) bounds the
    # fetch thread's wait for an answer; worker.close(force=True) waits for it.
    bench = one_bench
    long_lock_ms = 120_000
    pause_ms = 60_000
    bound_s = 5.0

    async def process(job: Any, token: str) -> str:
        return "done"

    bench.add_job()
    loop = LoopThread("bullmq-force-close")
    closing: concurrent.futures.Future[None] | None = None
    bench.client.client_pause(pause_ms, all=False)
    try:

        async def start() -> tuple[Any, asyncio.Future[Any]]:
            options = {"connection": bench.url, "prefix": PREFIX, "autorun": False}
            worker = Worker(bench.queue, process, {**options, "lockDuration": long_lock_ms})
            if actor is not None:
                # In process mode the fetch waits in the child: the close cuts it off.
                use_actor_lock_manager(worker, isolation=actor)
            return worker, asyncio.ensure_future(worker.run())

        worker, task = loop.call(start)
        wait_until(
            lambda: clients_blocked_in(bench, "evalsha", "eval"),
            SETTLE_S,
            "the worker's fetch to wait on the paused server",
        )

        async def force_close() -> None:
            await worker.close(force=True)
            await asyncio.gather(task, return_exceptions=True)

        closing = asyncio.run_coroutine_threadsafe(force_close(), loop.loop)
        try:
            closing.result(bound_s)
        except concurrent.futures.TimeoutError:
            pytest.fail(
                f"worker.close(force=True) did not return within {bound_s:.0f}s "
                f"(it waits for the fetch, up to lockDuration={long_lock_ms} ms)"
            )
    finally:
        bench.client.client_unpause()
        if closing is not None:
            closing.result(SETTLE_S)
        loop.close()


#: A Lua script that keeps the server busy for ``ARGV[1]`` microseconds.
BUSY_SCRIPT = """
local t = redis.call('TIME')
local start = t[1] * 1000000 + t[2]
repeat
  t = redis.call('TIME')
until t[1] * 1000000 + t[2] - start >= tonumber(ARGV[1])
return 1
"""


@pytest.mark.both_engines
@pytest.mark.parametrize("actor", [False, True], ids=["stock", "actor"])
def test_a_fetch_answered_after_lock_duration_is_not_orphaned(bench: Bench, actor: bool) -> None:
    # The server is busy (a slow script, a fork, a failover) for longer than
    # the lock when the worker's fetch arrives. Stock bullmq waits for the
    # answer; the fetch thread gives up after lockDuration and disconnects,
    # but the server runs the fetch anyway once it is free: the job is taken,
    # with a lock nobody renews, and nobody processes it until a stalled
    # check hands it back.
    #
    # Stock bullmq renews a job only once its processor starts: under load a
    # second between the server's move and the completion stalls it with a
    # one-second lock, which is not what this test is about. Its lock is
    # longer, the server busy for longer still.
    lock_ms = LOCK_MS if actor else 3 * LOCK_MS
    busy_s = 2.5 * lock_ms / 1000
    stalled_ms = lock_ms // 2

    async def process(job: Any, token: str) -> str:
        return "done"

    job_id = bench.add_job()
    # A running worker has its scripts loaded (the fixture flushed them).
    bench.client.script_load(loadScript(SCRIPT_DEFINITIONS["moveToActive"]))
    busy_client = bench.client.__class__.from_url(bench.url, socket_timeout=SETTLE_S + busy_s)
    busy = threading.Thread(
        target=lambda: busy_client.eval(BUSY_SCRIPT, 0, int(busy_s * 1_000_000)),
        name="busy-listener",
    )
    # Hold writes: the busy script queues first, the worker's fetch behind it.
    bench.client.client_pause(int(SETTLE_S * 1000), all=False)
    try:
        busy.start()
        wait_until(lambda: clients_blocked_in(bench, "eval"), SETTLE_S, "the busy script to queue")
        a = bench.start_worker(
            "A",
            process,
            {
                "lockDuration": lock_ms,
                "stalledInterval": stalled_ms,
                "runRetryDelay": lock_ms,
            },
            actor=actor,
        )
        wait_until(
            lambda: clients_blocked_in(bench, "evalsha"), SETTLE_S, "the worker's fetch to queue"
        )
    finally:
        bench.client.client_unpause()
    busy.join(SETTLE_S + busy_s)
    busy_client.close()

    wait_until(
        lambda: "finishedOn" in bench.job(job_id),
        busy_s + lock_ms / 1000 + 3 * stalled_ms / 1000 + SETTLE_S,
        "the job to finish",
    )
    # The job ran once: taken once, never stalled.
    stalled = [str(e.args[0]) for e in a.events.of("stalled")]
    assert stalled == [], f"the fetch the worker gave up on took the job anyway: {stalled}"
    assert bench.job(job_id).get("ats") == "1"
    assert bench.job(job_id).get("returnvalue") == '"done"'


@pytest.mark.parametrize("actor", [False, True], ids=["stock", "actor"])
def test_a_job_taken_but_never_processed_is_let_go(one_bench: Bench, actor: bool) -> None:
    # Between the fetch and the processor, bullmq emits "active" (and parses
    # the job). When that raises, bullmq's run loop reports "error" and never
    # processes the job. Stock bullmq never tracked it: its lock expires and
    # the stalled check hands it back. Tracked from the fetch, it must not be
    # renewed for ever with nobody to process it.
    bench = one_bench
    stalled_ms = LOCK_MS // 2
    raised: list[str] = []

    async def process(job: Any, token: str) -> str:
        return "done"

    a = bench.start_worker(
        "A", process, {"lockDuration": LOCK_MS, "stalledInterval": stalled_ms}, actor=actor
    )

    def active_once(job: Any, *args: Any) -> None:
        if not raised:
            raised.append(str(job.id))
            raise RuntimeError("an 'active' listener fails once")

    async def listen() -> None:
        a.worker.on("active", active_once)

    a.loop.call(listen)
    job_id = bench.add_job()
    wait_until(
        lambda: "finishedOn" in bench.job(job_id),
        lock_seconds(1) + 3 * stalled_ms / 1000 + SETTLE_S,
        "the job to be handed back and processed",
    )
    assert raised == [job_id]
    assert bench.job(job_id).get("returnvalue") == '"done"'


@pytest.mark.parametrize("actor", [False, True], ids=["stock", "actor"])
def test_a_refused_move_leaves_no_thread_behind_the_close(one_bench: Bench, actor: bool) -> None:
    # A move that raises makes the manager read the lock back "off the loop":
    # on the loop's default executor, whose thread outlives the worker.
    bench = one_bench
    bench.control()  # the loop that adds jobs: started before the count
    loop = LoopThread("bullmq-threads")
    try:
        before = set(threading.enumerate())

        async def process(job: Any, token: str) -> str:
            # The lock is gone when bullmq moves the job: the move is refused.
            await bench_async_delete(bench, job.id)
            return "done"

        async def start() -> tuple[Any, asyncio.Future[Any]]:
            options = {"connection": bench.url, "prefix": PREFIX, "autorun": False}
            worker = Worker(bench.queue, process, {**options, "lockDuration": LOCK_MS})
            if actor:
                use_actor_lock_manager(worker)
            errors: list[object] = []
            worker.on("error", lambda error, *_: errors.append(error))
            worker.errors = errors
            return worker, asyncio.ensure_future(worker.run())

        worker, task = loop.call(start)
        job_id = bench.add_job()
        wait_until(lambda: worker.errors, SETTLE_S, "bullmq to report the refused move")
        assert "Missing lock" in str(worker.errors[0])

        async def close() -> list[str]:
            return await close_worker(worker, task)

        hung = loop.call(close)
        assert hung == [], "worker.close() hung:\n" + "\n".join(hung)
        assert job_id
        deadline = time.monotonic() + SETTLE_S
        while (left := set(threading.enumerate()) - before) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not left, f"threads left behind by the closed worker: {sorted(t.name for t in left)}"
    finally:
        loop.close()


async def bench_async_delete(bench: Bench, job_id: str) -> None:
    """Delete the job's lock, as a thief or an operator would, from a processor."""
    client = redis.asyncio.Redis.from_url(bench.url)
    try:
        await client.delete(bench.key(job_id, "lock"))
    finally:
        await client.aclose()


def test_a_second_close_waits_for_the_first_to_release(one_bench: Bench) -> None:
    # run() closes the lock manager in its `finally` when its task is
    # cancelled (asyncio.run on Ctrl-C, a supervisor); worker.close() closes
    # it again. The second call returns at once, before the first has ended
    # the manager's threads: worker.close() returns with them still running.
    bench = one_bench
    long_lock_ms = 120_000
    bench.control()
    loop = LoopThread("bullmq-close-twice")
    bench.add_job()
    bench.client.client_pause(int(SETTLE_S * 1000), all=False)
    running: list[asyncio.Future[Any]] = []
    try:
        before = set(threading.enumerate())

        async def start() -> tuple[Any, asyncio.Future[Any]]:
            options = {"connection": bench.url, "prefix": PREFIX, "autorun": False}
            worker = Worker(bench.queue, None, {**options, "lockDuration": long_lock_ms})
            use_actor_lock_manager(worker)
            return worker, asyncio.ensure_future(worker.run())

        worker, task = loop.call(start)
        running.append(task)
        wait_until(
            lambda: clients_blocked_in(bench, "evalsha", "eval"),
            SETTLE_S,
            "the worker's fetch to wait on the paused server",
        )

        async def cancel_then_close() -> set[threading.Thread]:
            task.cancel()
            # run()'s `finally` is now closing the lock manager;
            while not worker.lockManager.closed:
                await asyncio.sleep(0)
            await worker.close()
            return set(threading.enumerate()) - before - {loop.thread}

        left = loop.call(cancel_then_close)
        assert not left, (
            f"worker.close() returned with the manager's threads running: "
            f"{sorted(t.name for t in left)}"
        )
    finally:
        bench.client.client_unpause()

        async def settle() -> None:
            await asyncio.gather(*running, return_exceptions=True)

        loop.call(settle)
        loop.close()
