"""Where a manager runs what users give it, and what that code can and cannot hold up.

Callbacks run on the delivery thread, targets' ``tell`` on the tellers'
threads, log handlers, meters and span processors on the record thread, an
answer's callbacks on the answers' thread: none on the manager's own threads.
Each test here broke that once, in a way a user would see: an ask that never
returned, a target never told, a record lost or pinning a tick's jobs.
Managers here renew through an in-memory lock table, ticked by hand.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
import tracemalloc
from typing import TYPE_CHECKING, Any

import pykka
from redis.exceptions import ConnectionError as RedisConnectionError

from actors import (
    ExtendLocks,
    GetStats,
    QueueKeys,
    get_active_job_count,
    get_stats,
    start_link,
    stop,
    track_job,
)
from actors.jobs import Deadlines, Validity
from actors.messages import LockLost
from actors.report import WARN_TELLERS, Tellers
from actors.telemetry import MAX_WAITING_RECORDS, RecordThread
from tests.support import (
    HoldingClock,
    Inbox,
    LockTable,
    manual_timer,
    settle,
    wait_for,
)
from tests.support.user_code import ASK_S, DUE_MS, LOCK, Blocks, Manual, handler

if TYPE_CHECKING:
    from collections.abc import Sequence

    from actors.messages import BatchOutcome

# -- user code that asks back --------------------------------------------------


def test_a_target_may_ask_for_a_tick_from_its_tell(manual: Manual) -> None:
    # Given a watched job whose target asks the manager for a tick when told
    outcomes: list[str] = []
    manager = manual.start()

    class Asks:
        def tell(self, _message: Any) -> None:
            try:
                manager.ask(ExtendLocks(), timeout=ASK_S)
                outcomes.append("answered")
            except pykka.Timeout:
                outcomes.append("timed out")

    track_job(manager, "a", "t", notify=Asks())  # not in the table: lost at the next tick
    # When the lock is lost and the target told
    manual.tick(manager, timeout=10 * ASK_S)
    # Then the target's own ask was answered
    wait_for(lambda: outcomes, ASK_S, "the target's ask")
    assert outcomes == ["answered"]


def test_a_log_handler_that_asks_for_a_tick_is_answered(manual: Manual) -> None:
    outcomes: list[str] = []
    manager = manual.start()

    def emit(record: logging.LogRecord) -> None:
        if "lost the lock of job" in record.getMessage():
            try:
                manager.ask(ExtendLocks(), timeout=ASK_S)
                outcomes.append("answered")
            except pykka.Timeout:
                outcomes.append("timed out")

    with handler(emit, logging.WARNING):
        track_job(manager, "a", "t")
        manual.tick(manager)
        wait_for(lambda: outcomes, 2 * ASK_S, "the handler's ask")
    assert outcomes == ["answered"]


# -- user code that stalls -------------------------------------------------------


def test_an_asked_tick_is_answered_while_a_log_handler_stalls(manual: Manual) -> None:
    # Given a WARNING handler stalled on a loss (a network handler on a dead link)
    release = manual.release()
    stalled = threading.Event()

    def stall(_record: logging.LogRecord) -> None:
        stalled.set()
        release.wait(30)

    manager = manual.start()
    manual.table.held["kept"] = "t"
    with handler(stall, logging.WARNING):
        track_job(manager, "kept", "t")
        track_job(manager, "lost", "t")
        manual.tick(manager)
        assert stalled.wait(ASK_S)
        # When the worker asks for a renewal
        manual.tick(manager)
    # Then it is answered: the lock was renewed again
    assert get_stats(manager, timeout=5).renewed == 2


def test_one_blocked_target_holds_up_no_asked_tick(manual: Manual) -> None:
    blocked = Blocks(manual.release())
    manager = manual.start()
    manual.table.held["kept"] = "t"
    track_job(manager, "kept", "t")
    track_job(manager, "blocked", "t", notify=blocked)
    manual.clock.advance(DUE_MS)
    manager.tell(ExtendLocks())  # its target is told, and blocks
    assert blocked.entered.wait(ASK_S)
    # When the worker asks for a renewal of its own, unrelated lock
    manual.tick(manager)
    assert get_stats(manager, timeout=5).renewed == 2


def test_a_watcher_is_told_while_many_other_targets_block(manual: Manual) -> None:
    # Given more targets that block than the tellers' warning count
    release = manual.release()
    blocked = [Blocks(release) for _ in range(WARN_TELLERS + 1)]
    manager = manual.start()
    for i, target in enumerate(blocked):
        track_job(manager, f"blocked-{i}", "t", notify=target)
    manual.clock.advance(DUE_MS)
    manager.tell(ExtendLocks())  # every lock lost: each blocking target is told
    for target in blocked:
        assert target.entered.wait(10)
    # When a watcher's lock is lost afterwards
    watcher = Inbox()
    track_job(manager, "watched", "t", notify=watcher)
    manual.clock.advance(DUE_MS)
    manager.tell(ExtendLocks())
    # Then it is told all the same
    wait_for(lambda: watcher.got, ASK_S, "the watcher told")
    assert [message.reason for message in watcher.got] == ["expired"]


def test_an_answers_callback_never_holds_the_manager() -> None:
    clock = HoldingClock()
    manager = start_link(
        renewer=LockTable(),
        keys=QueueKeys("answers"),
        lock_duration=LOCK,
        clock=clock,
        timer=manual_timer(),
    )
    try:
        settle(manager)
        # Given a query whose answer gets a slow callback before it is answered
        clock.hold(manager._manager.thread)
        answer: Any = manager.ask(GetStats(), block=False)
        clock.wait_held(timeout=5)
        ran_on: list[threading.Thread] = []
        release = threading.Event()

        def slow(_answer: Any) -> None:
            ran_on.append(threading.current_thread())
            release.wait(30)

        answer.add_done_callback(slow)
        clock.release()
        answer.get(timeout=5)
        # When the manager is asked anything next, it answers while the callback runs
        settle(manager)
        wait_for(lambda: ran_on, 5, "the callback")
        assert ran_on[0] is not manager._manager.thread
        release.set()
    finally:
        stop(manager, timeout=10)


# -- user code that raises -------------------------------------------------------


def test_a_raising_handler_costs_records_not_the_delivery_thread(manual: Manual) -> None:
    # Given a callback that raises and an ERROR handler that raises
    calls: list[list[str]] = []

    def renewed(ids: list[str]) -> None:
        calls.append(ids)
        raise ValueError("a callback's bug")

    def emit(record: logging.LogRecord) -> None:
        raise RuntimeError("a handler's bug")

    manager = manual.start("raising", on_locks_renewed=renewed)
    manual.table.held["a"] = "t"
    with handler(emit, logging.ERROR):
        track_job(manager, "a", "t")
        # When two ticks renew the lock
        manual.tick(manager)
        manual.tick(manager)
    # Then each called the callback, and once stopped no thread of the manager is left
    assert calls == [["a"], ["a"]]
    stop(manager, timeout=10)
    wait_for(
        lambda: not [t for t in threading.enumerate() if "-raising" in t.name],
        5,
        "the manager's threads to end",
    )


def test_the_first_record_that_raised_is_logged_though_others_were_dropped() -> None:
    warned: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            warned.append(record)

    def raises() -> None:
        raise RuntimeError("a meter's bug")

    keep = Keep(logging.WARNING)
    logger = logging.getLogger("actors.telemetry")
    logger.addHandler(keep)
    records = RecordThread("records-under-test")
    try:
        # Given a record thread that fell MAX_WAITING_RECORDS behind (not started yet)
        for _ in range(MAX_WAITING_RECORDS + 1):
            records.put(int)
        assert records.dropped == 1
        # When it catches up and then a record's writing raises
        records.start()
        records.put(raises)
        records.end(10)
    finally:
        logger.removeHandler(keep)
    # Then that is counted, and logged once
    assert records.dropped == 2
    assert len([r for r in warned if "writing a record raised" in r.getMessage()]) == 1


# -- what records say, and what they keep ----------------------------------------


def test_a_record_says_where_and_when_it_was_logged(manual: Manual) -> None:
    records: list[logging.LogRecord] = []
    manager = manual.start("origin")
    with handler(records.append, logging.WARNING):
        track_job(manager, "a", "t")
        manual.tick(manager)
        wait_for(lambda: records, ASK_S, "the loss's record")
    (lost,) = [r for r in records if "lost the lock of job" in r.getMessage()]
    assert (lost.module, lost.funcName) == ("report", "_log_lost")
    assert lost.threadName != "LockManager-records-origin"


def test_what_a_stopping_manager_logs_is_written(manual: Manual) -> None:
    class CloseFails(LockTable):
        def close(self) -> None:
            raise RuntimeError("the renewer's close failed")

    manual.table = CloseFails()
    records: list[logging.LogRecord] = []
    with handler(records.append, logging.DEBUG):
        for run in range(5):
            records.clear()
            stop(manual.start(f"stopping-{run}"), timeout=10)
            # Written by the time stop returns
            seen = [r.getMessage() for r in records]
            assert any("closing its renewer failed" in s for s in seen), seen
            assert any(s.endswith("stopped") for s in seen), seen


class Down(LockTable):
    """A server that refuses every renewal."""

    def __call__(self, job_ids: Sequence[str], tokens: Sequence[str]) -> BatchOutcome:
        raise RedisConnectionError("connection refused")


def test_a_waiting_record_does_not_keep_its_ticks_jobs_alive(manual: Manual) -> None:
    # Given 10,000 jobs, a server down, and an ERROR handler stalled on the first failure
    manual.table = Down()
    release = manual.release()
    stalled = threading.Event()

    def stall(_record: logging.LogRecord) -> None:
        stalled.set()
        release.wait(60)

    manager = manual.start("memory")
    with handler(stall, logging.ERROR):
        for i in range(10_000):
            track_job(manager, f"j{i}", "t")
        get_active_job_count(manager, timeout=30)
        manual.clock.advance(DUE_MS)
        manager.tell(ExtendLocks())
        assert stalled.wait(10)
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            # When the server stays down for 40 more ticks, each logging while the handler stalls
            for _ in range(40):
                ticks = get_stats(manager, timeout=5).renewing_ticks
                manual.clock.advance(DUE_MS)
                manager.tell(ExtendLocks())
                wait_for(
                    lambda ticks=ticks: get_stats(manager, timeout=5).renewing_ticks > ticks,  # type: ignore[misc]
                    10,
                    "the failed tick",
                )
            gc.collect()
            grown = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
    # Then each waiting record costs a record, not its tick's 10,000 ids and tokens
    assert grown / 40 < 20 * 1024, f"{grown / 40 / 1024:.0f} KB kept per failed tick"


# -- the tellers and the deadlines, on their own -----------------------------------


def test_the_tellers_start_their_threads_on_their_own_thread_not_the_callers() -> None:
    # Given a pool whose own thread is not started yet
    records = RecordThread("tellers-under-test")
    records.start()
    tellers = Tellers("tellers-under-test", records)
    targets = [Inbox() for _ in range(20)]
    threads = threading.active_count()
    # When the manager hands it a report's tells
    tellers.tell([(t, LockLost(f"j{i}", "t", "expired")) for i, t in enumerate(targets)])
    # Then it started no thread in the manager's stead; its own thread tells them
    assert threading.active_count() == threads
    tellers.start()
    wait_for(lambda: all(target.got for target in targets), 5, "every target told")
    tellers.end(time.monotonic() + 5)
    records.end(5)


class Counted(Validity):
    """A lock's validity that counts how often its deadline is read."""

    reads = 0

    @property
    def deadline(self) -> int:
        Counted.reads += 1
        return self.confirmed + self.span


def test_letting_go_of_many_watched_locks_reads_each_deadline_a_few_times() -> None:
    # Given 10,000 watched locks that share their deadline (tracked together)
    deadlines = Deadlines(lambda _job_id, confirmed, span: Counted(confirmed, span))
    for i in range(10_000):
        deadlines.watch(f"j{i}", 1_000_000, 875)
    Counted.reads = 0
    # When each is let go (a burst of losses)
    for i in range(10_000):
        deadlines.unwatch(f"j{i}")
    # Then the others' deadlines are not read again for each
    assert deadlines.earliest is None
    assert Counted.reads < 5 * 10_000
