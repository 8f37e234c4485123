"""The LockManager on a real server, with short durations, on every engine.

lock_duration is 800 ms (renew window 400 ms, a tick every 200 ms); waits
are derived from those numbers with wide margins, or poll with a deadline.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pykka
import pytest
import redis

from actors import (
    ExtendLocks,
    GetActiveJobCount,
    IsTracked,
    LockManager,
    QueueKeys,
    TrackJob,
    UntrackJob,
    get_active_job_count,
    get_stats,
    get_tracked_job_ids,
    is_tracked,
    start_link,
    stop,
    track_job,
    untrack_job,
)
from tests.integration.helpers import alive, evalsha_calls, take_locks, wait_for

pytestmark = pytest.mark.both_engines

KEYS = QueueKeys("q")
TTL = 800  # ms
TICK = TTL / 4 / 1000  # s


class Reports:
    """Collects what the callbacks were given, from the manager's thread."""

    def __init__(self) -> None:
        self.failed: Counter[str] = Counter()
        self.renewed: Counter[str] = Counter()
        self.errors: list[Exception] = []
        self.lock = threading.Lock()

    def on_failed(self, ids: list[str]) -> None:
        with self.lock:
            self.failed.update(ids)

    def on_renewed(self, ids: list[str]) -> None:
        with self.lock:
            self.renewed.update(ids)

    def on_error(self, exc: Exception) -> None:
        with self.lock:
            self.errors.append(exc)


@pytest.fixture
def reports() -> Reports:
    return Reports()


@pytest.fixture
def manager(engine_client: redis.Redis, reports: Reports) -> Iterator[pykka.ActorRef[LockManager]]:
    ref = start_link(
        connection=engine_client,
        keys=KEYS,
        lock_duration=TTL,
        on_lock_renewal_failed=reports.on_failed,
        on_locks_renewed=reports.on_renewed,
        on_error=reports.on_error,
    )
    yield ref
    stop(ref)


def test_tracked_locks_outlive_three_ttls_and_untracked_ones_expire(
    engine_client: redis.Redis, manager: pykka.ActorRef[LockManager], reports: Reports
) -> None:
    tracked = take_locks(engine_client, KEYS, [f"t{i}" for i in range(20)], TTL)
    untracked = take_locks(engine_client, KEYS, [f"u{i}" for i in range(5)], TTL)
    for job_id, token in tracked.items():
        track_job(manager, job_id, token)

    deadline = time.monotonic() + 3 * TTL / 1000
    while time.monotonic() < deadline:
        assert alive(engine_client, KEYS, tracked) == set(tracked)
        time.sleep(TICK / 2)

    assert alive(engine_client, KEYS, untracked) == set()
    assert not reports.failed
    assert not reports.errors
    assert set(reports.renewed) == set(tracked)
    assert get_active_job_count(manager) == 20


def test_an_untracked_job_is_no_longer_renewed(
    engine_client: redis.Redis, manager: pykka.ActorRef[LockManager]
) -> None:
    tokens = take_locks(engine_client, KEYS, ["a", "b"], TTL)
    for job_id, token in tokens.items():
        track_job(manager, job_id, token)
    untrack_job(manager, "a")

    wait_for(lambda: not engine_client.exists(KEYS.lock("a")), 3 * TTL / 1000, "a's lock to expire")

    assert alive(engine_client, KEYS, tokens) == {"b"}
    assert get_tracked_job_ids(manager) == ["b"]


def test_a_stolen_lock_is_reported_once_and_untracked(
    engine_client: redis.Redis, manager: pykka.ActorRef[LockManager], reports: Reports
) -> None:
    tokens = take_locks(engine_client, KEYS, ["mine", "stolen"], TTL)
    for job_id, token in tokens.items():
        track_job(manager, job_id, token)

    engine_client.set(KEYS.lock("stolen"), "another-worker", px=10 * TTL)
    wait_for(lambda: reports.failed, 3 * TTL / 1000, "the lost lock to be reported")
    time.sleep(2 * TTL / 1000)  # several more ticks: the report must not repeat

    assert reports.failed == Counter({"stolen": 1})
    assert not is_tracked(manager, "stolen")
    assert engine_client.get(KEYS.lock("stolen")) == b"another-worker"
    assert alive(engine_client, KEYS, tokens) == {"mine"}


def test_after_flushall_every_job_is_reported_once(
    engine_client: redis.Redis, manager: pykka.ActorRef[LockManager], reports: Reports
) -> None:
    tokens = take_locks(engine_client, KEYS, [f"j{i}" for i in range(50)], TTL)
    for job_id, token in tokens.items():
        track_job(manager, job_id, token)
    wait_for(lambda: len(reports.renewed) == 50, 3 * TTL / 1000, "a first renewal of every job")

    engine_client.flushall()
    wait_for(lambda: get_active_job_count(manager) == 0, 3 * TTL / 1000, "every job untracked")
    time.sleep(2 * TTL / 1000)

    assert reports.failed == Counter({job_id: 1 for job_id in tokens})
    assert not reports.errors


def test_renewal_goes_on_after_script_flush(
    engine_client: redis.Redis, manager: pykka.ActorRef[LockManager], reports: Reports
) -> None:
    tokens = take_locks(engine_client, KEYS, ["j"], TTL)
    track_job(manager, "j", tokens["j"])
    wait_for(lambda: reports.renewed["j"] >= 1, 3 * TTL / 1000, "a first renewal")

    engine_client.script_flush()
    seen = reports.renewed["j"]
    wait_for(lambda: reports.renewed["j"] >= seen + 2, 4 * TTL / 1000, "renewals after the flush")

    assert alive(engine_client, KEYS, tokens) == {"j"}
    assert not reports.errors and not reports.failed


def test_one_script_call_per_tick_whatever_the_job_count(
    engine_client: redis.Redis, reports: Reports
) -> None:
    # Up to max_batch due jobs make one script call; more make one per
    # max_batch, all in the same round trip (see test_scripts).
    ref = LockManager.start(
        connection=engine_client,
        keys=KEYS,
        lock_duration=TTL,
        max_batch=1000,
        _autostart_timer=False,
    )
    tokens = take_locks(engine_client, KEYS, [f"j{i}" for i in range(500)], 10 * TTL)
    for job_id, token in tokens.items():
        track_job(ref, job_id, token)
    time.sleep(TTL / 4 / 1000 + 0.05)  # every job past its threshold
    ref.ask(ExtendLocks())  # loads the script
    before = evalsha_calls(engine_client)
    time.sleep(TTL / 4 / 1000 + 0.05)

    ref.ask(ExtendLocks())

    assert evalsha_calls(engine_client) - before == 1
    assert get_stats(ref).renewed == 1000


def test_the_timer_sends_about_one_script_call_per_tick(
    engine_client: redis.Redis, manager: pykka.ActorRef[LockManager]
) -> None:
    tokens = take_locks(engine_client, KEYS, [f"j{i}" for i in range(200)], TTL)
    for job_id, token in tokens.items():
        track_job(manager, job_id, token)
    wait_for(lambda: get_stats(manager).renewed >= 200, 3 * TTL / 1000, "a first renewal")
    calls_before, ticks_before = evalsha_calls(engine_client), get_stats(manager).ticks

    time.sleep(3 * TTL / 1000)

    calls = evalsha_calls(engine_client) - calls_before
    ticks = get_stats(manager).ticks - ticks_before
    assert 1 <= calls <= ticks + 1
    assert ticks <= 3 * 4 + 2  # one timer, firing every TTL / 4


def test_thread_count_does_not_grow_with_jobs(
    engine_client: redis.Redis, manager: pykka.ActorRef[LockManager]
) -> None:
    track_job(manager, "first", "token")
    get_active_job_count(manager)
    with_one = threading.active_count()

    for i in range(2000):
        track_job(manager, f"j{i}", "token")
    assert get_active_job_count(manager) == 2001
    time.sleep(2 * TICK)

    assert threading.active_count() == with_one


def test_sixteen_threads_tracking_and_untracking_end_with_the_exact_set(
    manager: pykka.ActorRef[LockManager],
) -> None:
    expected: set[str] = set()
    expected_lock = threading.Lock()

    def worker(n: int) -> None:
        mine = [f"w{n}-{i}" for i in range(5000 // 16)]
        for job_id in mine:
            track_job(manager, job_id, "token")
        for job_id in mine[::2]:
            untrack_job(manager, job_id)
        with expected_lock:
            expected.update(mine[1::2])

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert set(get_tracked_job_ids(manager)) == expected


def test_proxy_and_messages_reach_the_same_state(
    engine_client: redis.Redis, manager: pykka.ActorRef[LockManager]
) -> None:
    proxy = manager.proxy()

    proxy.track_job("p", "token").get()
    manager.tell(TrackJob("m", "token"))
    manager.tell(UntrackJob("p"))

    assert manager.ask(GetActiveJobCount()) == 1
    assert manager.ask(IsTracked("m")) is True
    assert proxy.is_tracked("p").get() is False
    assert proxy.get_tracked_job_ids().get() == ["m"]
    with pytest.raises(ValueError, match="token"):
        proxy.track_job("x", "").get()
    assert manager.is_alive()


def test_tracking_again_replaces_the_token(
    engine_client: redis.Redis, manager: pykka.ActorRef[LockManager], reports: Reports
) -> None:
    old = take_locks(engine_client, KEYS, ["j"], TTL)["j"]
    track_job(manager, "j", "stale-token")
    track_job(manager, "j", old)

    wait_for(lambda: reports.renewed["j"] >= 2, 4 * TTL / 1000, "renewals with the new token")

    assert not reports.failed


def test_callbacks_that_raise_change_nothing(engine_client: redis.Redis) -> None:
    def boom(_: object) -> None:
        raise RuntimeError("callback bug")

    ref = start_link(
        connection=engine_client,
        keys=KEYS,
        lock_duration=TTL,
        on_lock_renewal_failed=boom,
        on_locks_renewed=boom,
    )
    tokens = take_locks(engine_client, KEYS, ["kept"], TTL)
    track_job(ref, "kept", tokens["kept"])
    track_job(ref, "gone", "never-locked")

    wait_for(lambda: get_stats(ref).lost == 1, 3 * TTL / 1000, "the missing lock's report")
    time.sleep(TTL / 1000)

    assert ref.is_alive()
    assert get_tracked_job_ids(ref) == ["kept"]
    assert alive(engine_client, KEYS, tokens) == {"kept"}


def test_a_failing_connection_keeps_every_job_and_reports_the_error(
    reports: Reports,
) -> None:
    # Nothing listens on port 1: every tick fails fast.
    ref = start_link(
        connection="redis://127.0.0.1:1/0",
        keys=KEYS,
        lock_duration=TTL,
        on_error=reports.on_error,
        on_lock_renewal_failed=reports.on_failed,
    )
    for i in range(10):
        track_job(ref, f"j{i}", "token")

    wait_for(lambda: len(reports.errors) >= 3, 6 * TTL / 1000, "three failed ticks")

    assert isinstance(reports.errors[0], redis.ConnectionError)
    assert get_active_job_count(ref) == 10
    assert not reports.failed
    assert get_stats(ref).errors >= 3


def test_stop_leaves_no_thread_and_sends_nothing_more(
    engine_client: redis.Redis, reports: Reports
) -> None:
    threads_before = threading.active_count()
    ref = start_link(
        connection=engine_client, keys=KEYS, lock_duration=TTL, on_locks_renewed=reports.on_renewed
    )
    tokens = take_locks(engine_client, KEYS, ["j"], TTL)
    track_job(ref, "j", tokens["j"])
    wait_for(lambda: reports.renewed, 3 * TTL / 1000, "a renewal")

    stop(ref)
    calls = evalsha_calls(engine_client)
    time.sleep(2 * TTL / 1000)

    assert threading.active_count() == threads_before
    assert evalsha_calls(engine_client) == calls
    stop(ref)
    track_job(ref, "k", "t")


def test_a_url_connection_is_built_and_closed_by_the_manager(
    engine_server: Any, engine_client: redis.Redis, reports: Reports
) -> None:
    ref = start_link(
        connection=engine_server.url,
        keys=KEYS,
        lock_duration=TTL,
        on_locks_renewed=reports.on_renewed,
    )
    tokens = take_locks(engine_client, KEYS, ["j"], TTL)
    track_job(ref, "j", tokens["j"])

    wait_for(lambda: reports.renewed["j"] >= 2, 4 * TTL / 1000, "renewals over the URL")
    stop(ref)

    def our_clients() -> int:
        return sum(1 for c in engine_client.client_list() if c.get("cmd", "").startswith("evalsha"))

    wait_for(lambda: our_clients() == 0, 5, "the manager's connection to close")


def test_a_client_without_socket_timeout_gets_a_warning(
    engine_server: Any, caplog: pytest.LogCaptureFixture
) -> None:
    client = redis.Redis.from_url(engine_server.url)
    try:
        ref = start_link(connection=client, keys=KEYS)
        stop(ref)
    finally:
        client.close()

    assert any(
        "socket_timeout" in r.getMessage() and r.levelname == "WARNING" for r in caplog.records
    )


def test_stop_from_a_callback_does_not_deadlock(engine_client: redis.Redis) -> None:
    stopped = threading.Event()
    refs: list[pykka.ActorRef[LockManager]] = []

    def give_up(_: list[str]) -> None:
        stop(refs[0])
        stopped.set()

    refs.append(
        start_link(
            connection=engine_client, keys=KEYS, lock_duration=TTL, on_lock_renewal_failed=give_up
        )
    )
    track_job(refs[0], "never-locked", "token")

    assert stopped.wait(3 * TTL / 1000)
    wait_for(lambda: not refs[0].is_alive(), 5, "the manager to stop")


def test_untrack_with_wait_lets_a_worker_release_its_lock_without_a_false_report(
    engine_client: redis.Redis, reports: Reports
) -> None:
    ref = LockManager.start(
        connection=engine_client,
        keys=KEYS,
        lock_duration=TTL,
        on_lock_renewal_failed=reports.on_failed,
        _autostart_timer=False,
    )
    tokens = take_locks(engine_client, KEYS, ["j"], TTL)
    track_job(ref, "j", tokens["j"])
    time.sleep(TTL / 4 / 1000 + 0.05)  # past its threshold: the next tick renews it
    ref.tell(ExtendLocks())  # a tick already queued when the worker finishes

    untrack_job(ref, "j", wait=True)
    engine_client.delete(KEYS.lock("j"))
    ref.ask(ExtendLocks())

    assert not reports.failed
    assert get_active_job_count(ref) == 0
