"""Closing the worker stops renewal and leaves no thread behind."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from bullmq import Worker

from actors.bullmq import ActorLockManager, use_actor_lock_manager
from tests.bullmq.harness import PREFIX, Bench, LoopThread, WorkerEvents, wait_until
from tests.conftest import Server

#: BullMQ's ``lockDuration``, in milliseconds.
LOCK_MS = 1000
#: Longest wait for a renewal or for the manager's threads to end, in seconds.
SETTLE_S = 5.0


def evalsha_calls(bench: Bench) -> int:
    stats = bench.client.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


@pytest.mark.both_engines
def test_close_stops_renewal_and_leaves_no_thread(bench: Bench) -> None:
    loop = LoopThread("bullmq-close")
    events = WorkerEvents()
    try:

        async def create() -> tuple[Any, ActorLockManager]:
            worker = Worker(
                bench.queue,
                None,
                {
                    "connection": bench.url,
                    "prefix": PREFIX,
                    "autorun": False,
                    "lockDuration": LOCK_MS,
                },
            )
            events.listen(worker, "locksRenewed", "lockRenewalFailed", "error")
            return worker, use_actor_lock_manager(worker)

        worker, installed = loop.call(create)
        before = set(threading.enumerate())

        # Given a job whose lock the manager renews (a lock taken by hand, as
        # bullmq's move to active takes it),
        token = "worker-token"
        bench.client.set(bench.key("7", "lock"), token, px=LOCK_MS)

        async def start_and_track() -> None:
            installed.start()
            installed.track_job("7", token, time.time_ns() // 1_000_000)

        loop.call(start_and_track)
        assert set(threading.enumerate()) > before, "the manager runs on threads of its own"
        events.wait("locksRenewed", lambda e: "7" in e.args[0]["jobIds"], SETTLE_S)

        # When the worker closes (bullmq's Worker.close closes its lock manager),
        loop.call(worker.close)
        calls = evalsha_calls(bench)

        # then the manager's threads are gone, the closing thread too,
        wait_until(
            lambda: set(threading.enumerate()) == before, SETTLE_S, "the manager's threads to end"
        )
        assert installed.closed and not installed.is_running()
        assert installed.manager is None
        assert installed.get_active_job_count() == 0

        # and the lock only counts down until it runs out: nothing renews it
        # (PTTL answers 0 in the last millisecond; -2 once the key is gone).
        ttls = []
        deadline = time.monotonic() + LOCK_MS / 1000 + SETTLE_S
        while (ttl := int(bench.client.pttl(bench.key("7", "lock")))) >= 0:
            assert time.monotonic() < deadline, "the lock did not expire"
            ttls.append(ttl)
            time.sleep(0.01)
        assert ttl == -2
        assert ttls == sorted(ttls, reverse=True)
        assert ttls[0] <= LOCK_MS
        assert evalsha_calls(bench) == calls
        assert events.of("lockRenewalFailed") == []

        async def track_after_close() -> object:
            return installed.track_job("8", token, time.time_ns() // 1_000_000, True)

        assert loop.call(track_after_close) is None
    finally:
        loop.close()


def test_closed_outside_any_loop_it_still_stops_the_manager(server: Server) -> None:
    # A worker's run() finalized by the garbage collector after its loop was
    # closed runs its `finally` (which closes the lock manager) with no loop.
    loop = LoopThread("bullmq-gc")
    try:

        async def create() -> ActorLockManager:
            worker = Worker("gc", None, {"connection": server.url, "autorun": False})
            return use_actor_lock_manager(worker)

        installed = loop.call(create)
        before = set(threading.enumerate())

        async def start() -> None:
            installed.start()

        loop.call(start)
        assert installed.is_running()
    finally:
        loop.close()

    closing = installed.close()
    with pytest.raises(StopIteration):
        closing.send(None)
    assert installed.manager is None
    wait_until(lambda: set(threading.enumerate()) == before - {loop.thread}, SETTLE_S, "threads")
