"""One regression test per defect a hostile read of 0.1 found, on a real server.

Each test names the defect it guards. Locks are short (400-800 ms) so a lost
renewal shows within a second or two; every wait is derived from the lock's
duration or polls with a deadline.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import pykka
import pytest
import redis

from actors import (
    ExtendLocks,
    ManagerRef,
    ManagerStopped,
    QueueKeys,
    TrackJob,
    get_active_job_count,
    get_stats,
    get_tracked_job_ids,
    is_tracked,
    start_link,
    stop,
    track_job,
    untrack_job,
)
from tests.support import Recorder, take_locks, wait_for, watch_locks

KEYS = QueueKeys("hardening")
TTL = 400  # ms: renew window 200 ms, interval 100 ms


def _manager(client: redis.Redis, **options: object) -> ManagerRef:
    options.setdefault("lock_duration", TTL)
    return start_link(connection=client, keys=KEYS, **options)  # type: ignore[arg-type]


def test_a_burst_of_manual_ticks_leaves_the_timer_alone(engine_client: redis.Redis) -> None:
    # Defect 1: every "renew now" pushed the timer one interval later.
    manager = _manager(engine_client)
    tokens = take_locks(engine_client, KEYS, ["a"], TTL)
    track_job(manager, "a", tokens["a"])
    ticks_before = get_stats(manager).ticks

    stop_asking = threading.Event()

    def ask_renew_now() -> None:
        while not stop_asking.is_set():
            manager.ask(ExtendLocks())

    asker = threading.Thread(target=ask_renew_now)
    asker.start()
    try:
        seen = watch_locks(engine_client, KEYS, tokens, seconds=5 * TTL / 1000, every=0.02)
    finally:
        stop_asking.set()
        asker.join()
    assert seen.missing == set()
    assert seen.lowest_pttl is not None and seen.lowest_pttl > 0
    assert get_stats(manager).ticks > ticks_before


@pytest.mark.parametrize(
    "bad",
    [("", "t"), ("j", ""), (7, "t"), ("j", None), ("bad-\udcff", "t"), ("j", "x" * 70_000)],
)
def test_every_door_refuses_bad_input_at_the_caller_and_the_manager_lives(
    redis_client: redis.Redis, bad: tuple[object, object]
) -> None:
    # Defects 2 and 3: a deferred proxy call killed the manager; a lone
    # surrogate passed validation and stopped every renewal.
    manager = _manager(redis_client)
    tokens = take_locks(redis_client, KEYS, ["good"], TTL)
    track_job(manager, "good", tokens["good"])
    proxy = manager.proxy()
    doors: list[Callable[[], object]] = [
        lambda: track_job(manager, *bad),  # type: ignore[arg-type]
        lambda: manager.tell(TrackJob(*bad)),  # type: ignore[arg-type]
        lambda: proxy.track_job(*bad),
        lambda: proxy.track_job.defer(*bad),
    ]
    for door in doors:
        with pytest.raises((TypeError, ValueError)):
            door()
    seen = watch_locks(redis_client, KEYS, tokens, seconds=3 * TTL / 1000)
    assert manager.is_alive()
    assert seen.missing == set()
    assert get_tracked_job_ids(manager) == ["good"]


def test_a_forged_message_is_dropped_and_the_rest_are_renewed(
    redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    # Defect 3, second half: one bad item that gets past the caller anyway
    # (a frozen message forged after its checks) must not block the others.
    manager = _manager(redis_client)
    tokens = take_locks(redis_client, KEYS, ["a", "b"], TTL)
    forged = TrackJob("x", "t")
    object.__setattr__(forged, "job_id", "bad-\udcff")
    track_job(manager, "a", tokens["a"])
    with caplog.at_level(logging.WARNING, logger="actors"):
        pykka.ActorRef.tell(manager, forged)  # around the reference's checks
        track_job(manager, "b", tokens["b"])
        seen = watch_locks(redis_client, KEYS, tokens, seconds=3 * TTL / 1000)
    assert seen.missing == set()
    assert sorted(get_tracked_job_ids(manager)) == ["a", "b"]
    assert "dropped" in caplog.text


def test_a_callback_that_queries_its_own_manager_gets_answers_at_once(
    redis_client: redis.Redis,
) -> None:
    # Defect 4: a callback asking its own manager waited forever.
    answers: list[object] = []
    done = threading.Event()
    holder: list[ManagerRef] = []

    def on_renewed(ids: list[str]) -> None:
        manager = holder[0]
        if done.is_set():
            return
        answers.extend(
            [
                get_active_job_count(manager),
                sorted(get_tracked_job_ids(manager)),
                is_tracked(manager, "a"),
                get_stats(manager).tracked,
                manager.proxy().is_tracked("b").get(),
            ]
        )
        untrack_job(manager, "b", wait=True)
        answers.append(is_tracked(manager, "b"))
        with pytest.raises(RuntimeError, match="own tick"):
            manager.ask(ExtendLocks())
        done.set()

    manager = _manager(redis_client, on_locks_renewed=on_renewed)
    holder.append(manager)
    tokens = take_locks(redis_client, KEYS, ["a", "b"], TTL)
    track_job(manager, "a", tokens["a"])
    track_job(manager, "b", tokens["b"])
    wait_for(done.is_set, 4 * TTL / 1000, "the callback's queries")
    assert answers == [2, ["a", "b"], True, 2, True, False]
    assert manager.is_alive()


def test_tracking_again_with_the_same_token_never_delays_renewal(
    engine_client: redis.Redis,
) -> None:
    # Defect 5: a progress hook re-tracking every 60 ms kept the job "fresh"
    # forever: its lock expired with no renewal and no report.
    manager = _manager(engine_client)
    tokens = take_locks(engine_client, KEYS, ["a"], TTL)
    track_job(manager, "a", tokens["a"])
    deadline = time.monotonic() + 5 * TTL / 1000
    lowest = TTL
    while time.monotonic() < deadline:
        track_job(manager, "a", tokens["a"])
        lowest = min(lowest, int(engine_client.pttl(KEYS.lock("a"))))
        time.sleep(0.06)
    assert lowest > 0
    assert engine_client.get(KEYS.lock("a")) == tokens["a"].encode()


def test_a_new_token_is_a_fresh_lock(redis_client: redis.Redis) -> None:
    recorder = Recorder()
    manager = _manager(redis_client, **recorder.callbacks())
    old = take_locks(redis_client, KEYS, ["a"], TTL)["a"]
    track_job(manager, "a", old)
    redis_client.set(KEYS.lock("a"), "new-token", px=TTL)
    track_job(manager, "a", "new-token")
    seen = watch_locks(redis_client, KEYS, {"a": "new-token"}, seconds=3 * TTL / 1000)
    assert seen.missing == set()
    assert recorder.lost() == []


@pytest.mark.parametrize("encoding", ["latin-1", "utf-16"])
def test_a_client_that_is_not_utf8_is_refused(server: object, encoding: str) -> None:
    # Defect 6: msgpack packs UTF-8 while the client encoded keys otherwise.
    client = redis.Redis.from_url(server.url, encoding=encoding, socket_timeout=0.05)  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="UTF-8"):
        start_link(connection=client, keys=KEYS, lock_duration=TTL)
    client.close()


def test_concurrent_stops_all_return(redis_client: redis.Redis) -> None:
    for _ in range(20):
        manager = _manager(redis_client)
        returned: list[bool] = []

        def stop_it(m: ManagerRef = manager, r: list[bool] = returned) -> None:
            stop(m, timeout=5)
            r.append(True)

        threads = [threading.Thread(target=stop_it) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=10)
        assert returned == [True] * 8
        assert not manager.is_alive()


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"lock_duration": 37_000_000_000_000}, ValueError),
        ({"lock_duration": 2**31, "lock_renew_time": 1000}, ValueError),
        ({"lock_duration": 1000, "max_batch": "10"}, TypeError),
        ({"lock_duration": 1000, "max_hold": 0}, ValueError),
    ],
)
def test_out_of_range_options_fail_at_start(
    redis_client: redis.Redis, options: dict[str, object], error: type[Exception]
) -> None:
    with pytest.raises(error):
        start_link(connection=redis_client, keys=KEYS, **options)  # type: ignore[arg-type]


def test_a_timer_that_cannot_start_releases_everything(redis_client: redis.Redis) -> None:
    closed = threading.Event()

    class Renewer:
        def __call__(self, job_ids: object, tokens: object) -> object:
            raise AssertionError("never called")

        def close(self) -> None:
            closed.set()

    def broken_timer(fire: object, name: str) -> object:
        raise RuntimeError("no threads left")

    manager = start_link(keys=KEYS, renewer=Renewer(), timer=broken_timer)  # type: ignore[arg-type]
    wait_for(closed.is_set, 5, "the renewer's close")
    stop(manager, timeout=5)
    assert not manager.is_alive()


def test_a_callback_raising_system_exit_stops_nothing(redis_client: redis.Redis) -> None:
    class Bystander(pykka.ThreadingActor):
        pass

    bystander = Bystander.start()

    def on_renewed(ids: list[str]) -> None:
        raise SystemExit(1)

    manager = _manager(redis_client, on_locks_renewed=on_renewed)
    tokens = take_locks(redis_client, KEYS, ["a"], TTL)
    track_job(manager, "a", tokens["a"])
    seen = watch_locks(redis_client, KEYS, tokens, seconds=3 * TTL / 1000)
    assert seen.missing == set()
    assert get_stats(manager).renewed >= 2
    assert manager.is_alive() and bystander.is_alive()


def test_after_stop_tells_warn_once_and_asks_say_stopped(
    redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    manager = _manager(redis_client)
    stop(manager)
    with caplog.at_level(logging.WARNING, logger="actors"):
        track_job(manager, "a", "t")
        track_job(manager, "b", "t")
        untrack_job(manager, "a")
        untrack_job(manager, "a", wait=True)
    assert caplog.text.count("is stopped") == 1
    with pytest.raises(ManagerStopped, match="'hardening' is stopped"):
        get_stats(manager)
    with pytest.raises(pykka.ActorDeadError):
        is_tracked(manager, "a")
    stop(manager)  # idempotent


def test_a_lost_lock_is_reported_with_its_token_reason_and_key(
    engine_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    recorder = Recorder()
    manager = _manager(engine_client, **recorder.callbacks())
    tokens = take_locks(engine_client, KEYS, ["stolen", "gone", "kept"], TTL)
    for job_id, token in tokens.items():
        track_job(manager, job_id, token)
    with caplog.at_level(logging.WARNING, logger="actors"):
        engine_client.set(KEYS.lock("stolen"), "thief", px=TTL)
        engine_client.delete(KEYS.lock("gone"))
        wait_for(lambda: len(recorder.lost()) == 2, 4 * TTL / 1000, "two losses")
    lost = {item.job_id: (item.token, item.reason) for item in recorder.lost()}
    assert lost == {
        "stolen": (tokens["stolen"], "stolen"),
        "gone": (tokens["gone"], "expired"),
    }
    assert KEYS.lock("gone") in caplog.text and "prefix" in caplog.text
    assert get_tracked_job_ids(manager) == ["kept"]


def test_a_client_timeout_that_breaks_the_rule_is_warned_with_one_number(
    redis_client: redis.Redis, server: object, caplog: pytest.LogCaptureFixture
) -> None:
    client = redis.Redis.from_url(server.url, socket_timeout=2)  # type: ignore[attr-defined]
    with caplog.at_level(logging.WARNING, logger="actors"):
        manager = start_link(connection=client, keys=KEYS, lock_duration=2000)
    stop(manager)
    client.close()
    assert "socket_timeout=2 s" in caplog.text
    assert "socket_timeout=0.125" in caplog.text


def test_a_prefix_written_into_the_queue_name_is_refused() -> None:
    with pytest.raises(ValueError, match=r"QueueKeys\('emails', prefix='bull'\)"):
        QueueKeys("bull:emails")


def test_a_lock_key_of_another_type_is_one_lost_job_and_the_rest_are_renewed(
    engine_client: redis.Redis,
) -> None:
    # Defect 8: GET on a hash aborted the script call: earlier jobs renewed
    # but never counted, later ones expired unreported.
    recorder = Recorder()
    manager = _manager(engine_client, **recorder.callbacks())
    tokens = take_locks(engine_client, KEYS, ["a", "b", "c"], TTL)
    for job_id, token in tokens.items():
        track_job(manager, job_id, token)
    engine_client.delete(KEYS.lock("b"))
    engine_client.hset(KEYS.lock("b"), "holder", "someone")
    wait_for(recorder.lost, 4 * TTL / 1000, "the loss of b")
    seen = watch_locks(engine_client, KEYS, {"a": tokens["a"], "c": tokens["c"]}, 3 * TTL / 1000)
    assert seen.missing == set()
    assert [(item.job_id, item.reason) for item in recorder.lost()] == [("b", "stolen")]
    assert sorted(get_tracked_job_ids(manager)) == ["a", "c"]


def test_untracking_an_old_lock_by_its_token_leaves_the_new_one_tracked(
    redis_client: redis.Redis,
) -> None:
    # A lease (or a worker) releasing its old lock must not untrack the job's
    # newer lock, taken since with another token.
    manager = _manager(redis_client)
    track_job(manager, "a", "old-token")
    redis_client.set(KEYS.lock("a"), "new-token", px=TTL)
    track_job(manager, "a", "new-token")
    untrack_job(manager, "a", token="old-token", wait=True)
    assert is_tracked(manager, "a")
    seen = watch_locks(redis_client, KEYS, {"a": "new-token"}, seconds=3 * TTL / 1000)
    assert seen.missing == set()
    untrack_job(manager, "a", token="new-token", wait=True)
    assert not is_tracked(manager, "a")
