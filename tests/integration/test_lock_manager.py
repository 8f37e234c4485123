"""The LockManager on a real server, with short durations, on every engine.

lock_duration is 800 ms (renew window 400 ms, a tick every 200 ms); waits
are derived from those numbers with wide margins, or poll with a deadline.
Tests that count ticks exactly drive the manager's clock and timer by hand.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from typing import TYPE_CHECKING

import pytest
import redis

from actors import (
    ExtendLocks,
    GetActiveJobCount,
    IsTracked,
    ManagerRef,
    QueueKeys,
    Timing,
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
from actors.connection import command_timeout
from tests.conftest import Server
from tests.support import (
    ManualClock,
    Recorder,
    alive,
    evalsha_calls,
    manual_timer,
    settle,
    take_locks,
    tick,
    wait_for,
    wait_ticks,
    watch_locks,
)

if TYPE_CHECKING:
    from tests.conftest import StartManager

pytestmark = pytest.mark.both_engines

KEYS = QueueKeys("q")
TTL = 800  # ms
TIMING = Timing(TTL)
TICK = TIMING.interval / 1000  # s


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def manager(
    engine_client: redis.Redis, recorder: Recorder, start_manager: StartManager
) -> ManagerRef:
    return start_manager(
        connection=engine_client, keys=KEYS, lock_duration=TTL, **recorder.callbacks()
    )


def start_manual(
    engine_client: redis.Redis, clock: ManualClock, recorder: Recorder, **options: int
) -> ManagerRef:
    """A manager whose clock the test moves and whose ticks the test sends."""
    timer = manual_timer()
    return recorder.start(
        engine_client, KEYS, lock_duration=TTL, clock=clock, timer=timer, **options
    )


def test_tracked_locks_outlive_three_ttls_and_untracked_ones_expire(
    engine_client: redis.Redis, manager: ManagerRef, recorder: Recorder
) -> None:
    tracked = take_locks(engine_client, KEYS, [f"t{i}" for i in range(20)], TTL)
    untracked = take_locks(engine_client, KEYS, [f"u{i}" for i in range(5)], TTL)
    for job_id, token in tracked.items():
        track_job(manager, job_id, token)

    seen = watch_locks(engine_client, KEYS, tracked, 3 * TTL / 1000, every=TICK / 2)

    assert seen.missing == set()
    assert seen.lowest_pttl is not None and seen.lowest_pttl > 0
    assert alive(engine_client, KEYS, untracked) == set()
    assert recorder.lost() == []
    assert recorder.errors() == []
    assert set(recorder.renewed()) == set(tracked)
    assert get_active_job_count(manager) == 20


def test_an_untracked_job_is_no_longer_renewed(
    engine_client: redis.Redis, manager: ManagerRef
) -> None:
    tokens = take_locks(engine_client, KEYS, ["a", "b"], TTL)
    for job_id, token in tokens.items():
        track_job(manager, job_id, token)
    untrack_job(manager, "a")

    wait_for(lambda: not engine_client.exists(KEYS.lock("a")), 3 * TTL / 1000, "a's lock to expire")

    assert alive(engine_client, KEYS, tokens) == {"b"}
    assert get_tracked_job_ids(manager) == ["b"]


def test_a_stolen_lock_is_reported_once_with_its_token_and_untracked(
    engine_client: redis.Redis, manager: ManagerRef, recorder: Recorder
) -> None:
    tokens = take_locks(engine_client, KEYS, ["mine", "stolen"], TTL)
    for job_id, token in tokens.items():
        track_job(manager, job_id, token)

    engine_client.set(KEYS.lock("stolen"), "another-worker", px=10 * TTL)
    wait_for(recorder.lost, 3 * TTL / 1000, "the lost lock to be reported")
    wait_ticks(manager, 4, 8 * TTL / 1000)  # several more ticks: the report must not repeat

    assert [(lost.job_id, lost.token, lost.reason) for lost in recorder.lost()] == [
        ("stolen", tokens["stolen"], "stolen")
    ]
    assert not is_tracked(manager, "stolen")
    assert engine_client.get(KEYS.lock("stolen")) == b"another-worker"
    assert alive(engine_client, KEYS, tokens) == {"mine"}


def test_after_flushall_every_job_is_reported_once_as_expired(
    engine_client: redis.Redis, manager: ManagerRef, recorder: Recorder
) -> None:
    tokens = take_locks(engine_client, KEYS, [f"j{i}" for i in range(50)], TTL)
    for job_id, token in tokens.items():
        track_job(manager, job_id, token)
    recorder.wait_renewed(tokens, 3 * TTL / 1000)

    engine_client.flushall()
    wait_for(lambda: get_active_job_count(manager) == 0, 3 * TTL / 1000, "every job untracked")
    wait_ticks(manager, 4, 8 * TTL / 1000)

    assert recorder.lost_counts() == Counter(dict.fromkeys(tokens, 1))
    assert {lost.reason for lost in recorder.lost()} == {"expired"}
    assert recorder.errors() == []


def test_renewal_goes_on_after_script_flush(
    engine_client: redis.Redis, manager: ManagerRef, recorder: Recorder
) -> None:
    tokens = take_locks(engine_client, KEYS, ["j"], TTL)
    track_job(manager, "j", tokens["j"])
    wait_for(lambda: recorder.renewed()["j"] >= 1, 3 * TTL / 1000, "a first renewal")

    engine_client.script_flush()
    seen = recorder.renewed()["j"]
    wait_for(lambda: recorder.renewed()["j"] >= seen + 2, 4 * TTL / 1000, "renewals after it")

    assert alive(engine_client, KEYS, tokens) == {"j"}
    assert recorder.errors() == []
    assert recorder.lost() == []


def test_one_script_call_per_tick_whatever_the_job_count(
    engine_client: redis.Redis, recorder: Recorder
) -> None:
    # Up to max_batch due jobs make one script call; more make one per
    # max_batch, all in the same round trip (see test_scripts).
    clock = ManualClock()
    ref = start_manual(engine_client, clock, recorder, max_batch=1000)
    tokens = take_locks(engine_client, KEYS, [f"j{i}" for i in range(500)], 10 * TTL)
    for job_id, token in tokens.items():
        track_job(ref, job_id, token)
    settle(ref)
    clock.advance(TIMING.threshold + 1)  # every job past its threshold
    tick(ref)  # loads the script
    before = evalsha_calls(engine_client)
    clock.advance(TIMING.threshold + 1)

    tick(ref)

    assert evalsha_calls(engine_client) - before == 1
    assert get_stats(ref).renewed == 1000


def test_tracking_again_with_the_same_token_keeps_the_older_stamp(
    engine_client: redis.Redis, recorder: Recorder
) -> None:
    # A progress hook that tracks its job again must not delay its renewal.
    clock = ManualClock()
    ref = start_manual(engine_client, clock, recorder)
    tokens = take_locks(engine_client, KEYS, ["same", "fresh"], 10 * TTL)
    for job_id, token in tokens.items():
        track_job(ref, job_id, token)
    settle(ref)
    clock.advance(TIMING.threshold + 1)

    track_job(ref, "same", tokens["same"])
    engine_client.set(KEYS.lock("fresh"), "a-new-token", px=10 * TTL)
    track_job(ref, "fresh", "a-new-token")
    tick(ref)

    assert recorder.renewed() == Counter({"same": 1})
    assert get_tracked_job_ids(ref) == ["same", "fresh"]


def test_the_timer_sends_about_one_script_call_per_tick(
    engine_client: redis.Redis, manager: ManagerRef
) -> None:
    tokens = take_locks(engine_client, KEYS, [f"j{i}" for i in range(200)], TTL)
    for job_id, token in tokens.items():
        track_job(manager, job_id, token)
    wait_for(lambda: get_stats(manager).renewed >= 200, 3 * TTL / 1000, "a first renewal")
    calls_before, ticks_before = evalsha_calls(engine_client), get_stats(manager).ticks

    time.sleep(3 * TTL / 1000)  # the window the rates are measured over

    calls = evalsha_calls(engine_client) - calls_before
    ticks = get_stats(manager).ticks - ticks_before
    assert 1 <= calls <= ticks + 1
    assert ticks <= 3 * 4 + 2  # one timer, firing every TTL / 4


def test_thread_count_does_not_grow_with_jobs(
    engine_client: redis.Redis, manager: ManagerRef
) -> None:
    track_job(manager, "first", "token")
    settle(manager)
    with_one = threading.active_count()

    for i in range(2000):
        track_job(manager, f"j{i}", "token")
    assert get_active_job_count(manager) == 2001
    wait_ticks(manager, 2, 4 * TTL / 1000)

    assert threading.active_count() == with_one


def test_sixteen_threads_tracking_and_untracking_end_with_the_exact_set(
    engine_client: redis.Redis, recorder: Recorder
) -> None:
    # The timer ticks every 200 ms while the threads run, on jobs whose locks
    # are held (as a worker holds them before it tracks): every tick that
    # finds a job due renews it. Sending the 7,500 messages takes longer than
    # one renew threshold on a busy machine, so a job without a lock would
    # rightly be reported lost and untracked mid-run. Each renewal sets a TTL
    # of a minute, so no pause of this process lets a lock lapse either.
    hold_ms = 60_000
    ids = {n: [f"w{n}-{i}" for i in range(5000 // 16)] for n in range(16)}
    tokens = take_locks(
        engine_client, KEYS, [job for mine in ids.values() for job in mine], hold_ms
    )
    manager = start_link(
        connection=engine_client,
        keys=KEYS,
        lock_duration=hold_ms,
        lock_renew_time=TIMING.renew_time,
        **recorder.callbacks(),
    )
    expected: set[str] = set()
    expected_lock = threading.Lock()

    def worker(mine: list[str]) -> None:
        for job_id in mine:
            track_job(manager, job_id, tokens[job_id])
        for job_id in mine[::2]:
            untrack_job(manager, job_id)
        with expected_lock:
            expected.update(mine[1::2])

    threads = [threading.Thread(target=worker, args=(mine,)) for mine in ids.values()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert set(get_tracked_job_ids(manager)) == expected
    assert recorder.lost() == []
    assert recorder.errors() == []


def test_proxy_and_messages_reach_the_same_state(manager: ManagerRef) -> None:
    proxy = manager.proxy()

    proxy.track_job("p", "token").get()
    manager.tell(TrackJob("m", "token"))
    manager.tell(UntrackJob("p"))

    assert manager.ask(GetActiveJobCount()) == 1
    assert manager.ask(IsTracked("m")) is True
    assert proxy.is_tracked("p").get() is False
    assert proxy.get_tracked_job_ids().get() == ["m"]
    with pytest.raises(ValueError, match="token"):
        proxy.track_job("x", "")
    assert manager.is_alive()


def test_tracking_again_with_a_new_token_renews_the_new_lock(
    engine_client: redis.Redis, manager: ManagerRef, recorder: Recorder
) -> None:
    held = take_locks(engine_client, KEYS, ["j"], TTL)["j"]
    track_job(manager, "j", "stale-token")
    track_job(manager, "j", held)

    wait_for(lambda: recorder.renewed()["j"] >= 2, 4 * TTL / 1000, "renewals with the new token")

    assert recorder.lost() == []


def test_callbacks_that_raise_are_logged_and_change_nothing(
    engine_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="actors")

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
    wait_ticks(ref, 4, 8 * TTL / 1000)

    assert ref.is_alive()
    assert get_tracked_job_ids(ref) == ["kept"]
    assert alive(engine_client, KEYS, tokens) == {"kept"}
    raised = {
        name
        for r in caplog.records
        if r.exc_info and str(r.exc_info[1]) == "callback bug"
        for name in ("on_locks_renewed", "on_lock_renewal_failed")
        if name in r.getMessage()
    }
    assert raised == {"on_locks_renewed", "on_lock_renewal_failed"}


def test_a_failing_connection_keeps_every_job_and_reports_the_error(recorder: Recorder) -> None:
    # Nothing listens on port 1: every tick fails fast.
    ref = start_link(
        connection="redis://127.0.0.1:1/0", keys=KEYS, lock_duration=TTL, **recorder.callbacks()
    )
    for i in range(10):
        track_job(ref, f"j{i}", "token")

    wait_for(lambda: len(recorder.errors()) >= 3, 6 * TTL / 1000, "three failed ticks")

    assert isinstance(recorder.errors()[0], redis.ConnectionError)
    assert get_active_job_count(ref) == 10
    assert recorder.lost() == []
    assert get_stats(ref).errors >= 3


def test_stop_leaves_no_thread_and_sends_nothing_more(
    engine_client: redis.Redis, recorder: Recorder
) -> None:
    threads_before = threading.active_count()
    ref = start_link(connection=engine_client, keys=KEYS, lock_duration=TTL, **recorder.callbacks())
    tokens = take_locks(engine_client, KEYS, ["j"], TTL)
    track_job(ref, "j", tokens["j"])
    recorder.wait_renewed(tokens, 3 * TTL / 1000)

    stop(ref)
    calls = evalsha_calls(engine_client)
    time.sleep(2 * TTL / 1000)  # eight tick intervals in which nothing may be sent

    assert threading.active_count() == threads_before
    assert evalsha_calls(engine_client) == calls
    stop(ref)
    track_job(ref, "k", "t")


def test_a_url_connection_is_built_and_closed_by_the_manager(
    engine_server: Server, engine_client: redis.Redis, recorder: Recorder
) -> None:
    ref = start_link(
        connection=engine_server.url, keys=KEYS, lock_duration=TTL, **recorder.callbacks()
    )
    tokens = take_locks(engine_client, KEYS, ["j"], TTL)
    track_job(ref, "j", tokens["j"])

    wait_for(lambda: recorder.renewed()["j"] >= 2, 4 * TTL / 1000, "renewals over the URL")
    stop(ref)

    def our_clients() -> int:
        return sum(1 for c in engine_client.client_list() if c.get("cmd", "").startswith("evalsha"))

    wait_for(lambda: our_clients() == 0, 5, "the manager's connection to close")


@pytest.mark.parametrize(
    ("timeout", "said"),
    [(None, "the client has no socket_timeout"), (10, "the client has socket_timeout=10 s")],
    ids=["none", "too-long"],
)
def test_a_client_that_can_hold_a_tick_too_long_gets_a_warning_with_the_fix(
    engine_server: Server, caplog: pytest.LogCaptureFixture, timeout: float | None, said: str
) -> None:
    client = redis.Redis.from_url(engine_server.url, socket_timeout=timeout)
    try:
        with caplog.at_level(logging.WARNING, logger="actors"):
            stop(start_link(connection=client, keys=KEYS, lock_duration=TTL))
    finally:
        client.close()

    (warning,) = [r.getMessage() for r in caplog.records if r.name.startswith("actors")]
    assert said in warning
    limit = command_timeout(Timing(TTL))
    assert f"pass socket_timeout={limit:g} (or less), or pass a URL" in warning


def test_a_client_bounded_within_the_command_timeout_starts_quietly(
    engine_server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    client = redis.Redis.from_url(engine_server.url, socket_timeout=0.05)
    try:
        with caplog.at_level(logging.WARNING, logger="actors"):
            stop(start_link(connection=client, keys=KEYS, lock_duration=TTL))
    finally:
        client.close()

    assert [r for r in caplog.records if r.name.startswith("actors")] == []


def test_stop_from_a_callback_returns_and_the_manager_stops(engine_client: redis.Redis) -> None:
    stopped = threading.Event()
    refs: list[ManagerRef] = []

    def give_up(_: object) -> None:
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
    engine_client: redis.Redis, recorder: Recorder
) -> None:
    clock = ManualClock()
    ref = start_manual(engine_client, clock, recorder)
    tokens = take_locks(engine_client, KEYS, ["j"], TTL)
    track_job(ref, "j", tokens["j"])
    settle(ref)
    clock.advance(TIMING.threshold + 1)  # past its threshold: the next tick renews it
    ref.tell(ExtendLocks())  # a tick already queued when the worker finishes

    untrack_job(ref, "j", wait=True)
    engine_client.delete(KEYS.lock("j"))
    tick(ref)

    assert recorder.lost() == []
    assert get_active_job_count(ref) == 0
