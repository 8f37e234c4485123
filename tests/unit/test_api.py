"""Bad input fails at the call site, naming the argument; nothing reaches Redis."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pykka
import pytest

from actors import (
    ExtendLocks,
    LockManager,
    ManagerRef,
    ManagerStopped,
    QueueKeys,
    TrackJob,
    UntrackJob,
    is_tracked,
    start_link,
    stop,
    track_job,
    untrack_job,
)
from actors.timing import MAX_DURATION_MS, MAX_TEXT_BYTES
from tests.support import unchecked

# Nothing listens here: these tests must fail before any command is sent.
UNUSED_URL = "redis://127.0.0.1:1/0"


@pytest.fixture
def manager() -> Iterator[ManagerRef]:
    ref = start_link(connection=UNUSED_URL, keys=QueueKeys("q"))
    yield ref
    stop(ref)


@pytest.mark.parametrize(
    ("job_id", "token", "error", "argument"),
    [
        ("", "t", ValueError, "job_id"),
        (None, "t", TypeError, "job_id"),
        (42, "t", TypeError, "job_id"),
        ("j\udc80", "t", ValueError, "job_id"),
        ("j" * (MAX_TEXT_BYTES + 1), "t", ValueError, "job_id"),
        ("j", "", ValueError, "token"),
        ("j", None, TypeError, "token"),
        ("j", b"t", TypeError, "token"),
        ("j", "é" * (MAX_TEXT_BYTES // 2 + 1), ValueError, "token"),
    ],
)
def test_track_job_refuses_bad_ids_and_tokens(
    manager: ManagerRef, job_id: Any, token: Any, error: type[Exception], argument: str
) -> None:
    with pytest.raises(error, match=argument):
        track_job(manager, job_id, token)


def test_the_longest_id_and_token_are_accepted(manager: ManagerRef) -> None:
    longest = "j" * MAX_TEXT_BYTES
    track_job(manager, longest, "é" * (MAX_TEXT_BYTES // 2))

    assert is_tracked(manager, longest, timeout=5)


@pytest.mark.parametrize(
    ("options", "error", "argument"),
    [
        ({"ts": 1.5}, TypeError, "ts"),
        ({"max_hold": 0}, ValueError, "max_hold"),
        ({"max_hold": MAX_DURATION_MS + 1}, ValueError, "max_hold"),
        ({"notify": "someone"}, TypeError, "notify"),
    ],
)
def test_track_job_refuses_bad_options(
    manager: ManagerRef, options: dict[str, Any], error: type[Exception], argument: str
) -> None:
    with pytest.raises(error, match=argument):
        track_job(manager, "j", "t", **options)


@pytest.mark.parametrize("job_id", ["", None, 7])
def test_untrack_and_is_tracked_refuse_bad_ids(manager: ManagerRef, job_id: Any) -> None:
    with pytest.raises((TypeError, ValueError), match="job_id"):
        untrack_job(manager, job_id)
    with pytest.raises((TypeError, ValueError), match="job_id"):
        is_tracked(manager, job_id)


def test_the_helpers_refuse_what_is_not_a_manager_reference() -> None:
    with pytest.raises(TypeError, match="manager must be the reference"):
        track_job("manager", "j", "t")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("options", "error", "argument"),
    [
        ({"lock_duration": 0}, ValueError, "lock_duration"),
        ({"lock_duration": "30000"}, TypeError, "lock_duration"),
        ({"lock_duration": MAX_DURATION_MS + 1}, ValueError, "lock_duration"),
        ({"lock_duration": 1000, "lock_renew_time": 1000}, ValueError, "lock_renew_time"),
        ({"lock_duration": 1000, "lock_renew_time": 1}, ValueError, "lock_renew_time"),
        ({"max_batch": 0}, ValueError, "max_batch"),
        ({"max_batch": 2.5}, TypeError, "max_batch"),
        ({"max_batch": True}, TypeError, "max_batch"),
        ({"max_hold": 0}, ValueError, "max_hold"),
        ({"max_hold": 1.5}, TypeError, "max_hold"),
        ({"on_error": "log"}, TypeError, "on_error"),
        ({"on_lock_renewal_failed": 1}, TypeError, "on_lock_renewal_failed"),
        ({"on_locks_renewed": []}, TypeError, "on_locks_renewed"),
        ({"clock": 0}, TypeError, "clock"),
        ({"timer": "manual"}, TypeError, "timer"),
        ({"keys": "q"}, TypeError, "keys"),
        ({"connection": 6379}, TypeError, "connection"),
        ({"connection": None}, TypeError, "connection"),
        ({"renewer": lambda ids, tokens: None}, TypeError, "connection or renewer"),
    ],
)
def test_start_link_refuses_bad_options(
    options: dict[str, Any], error: type[Exception], argument: str
) -> None:
    arguments: dict[str, Any] = {"connection": UNUSED_URL, "keys": QueueKeys("q"), **options}

    with pytest.raises(error, match=argument):
        start_link(**arguments)

    assert pykka.ActorRegistry.get_all() == []


@pytest.mark.parametrize("seconds", [5, 30, 60, 99])
def test_a_lock_duration_in_seconds_is_refused_saying_milliseconds(seconds: int) -> None:
    # Given seconds typed where milliseconds are meant, a manager on Redis
    # would cut every lock to that many milliseconds and tick hundreds of
    # times a second.
    with pytest.raises(ValueError, match="lock_duration is in milliseconds") as refused:
        start_link(connection=UNUSED_URL, keys=QueueKeys("q"), lock_duration=seconds)

    assert f"lock_duration={seconds * 1000}" in str(refused.value)
    assert pykka.ActorRegistry.get_all() == []


def test_the_shortest_redis_lock_is_accepted() -> None:
    stop(start_link(connection=UNUSED_URL, keys=QueueKeys("q"), lock_duration=100))


def test_a_bad_url_is_refused_at_start() -> None:
    with pytest.raises(ValueError, match="redis://"):
        start_link(connection="http://example", keys=QueueKeys("q"))


@pytest.mark.parametrize(
    ("build", "error", "argument"),
    [
        (lambda: TrackJob(None, None), TypeError, "job_id"),  # type: ignore[arg-type]
        (lambda: TrackJob("j", ""), ValueError, "token"),
        (lambda: UntrackJob(""), ValueError, "job_id"),
        (lambda: ExtendLocks(1.5), TypeError, "scheduled"),  # type: ignore[arg-type]
    ],
)
def test_a_malformed_message_cannot_be_built(
    build: Any, error: type[Exception], argument: str
) -> None:
    with pytest.raises(error, match=argument):
        build()


def test_what_is_no_message_is_refused_at_the_caller(manager: ManagerRef) -> None:
    for garbage in ("garbage", None, 42, object()):
        with pytest.raises(TypeError, match="takes its messages"):
            manager.tell(garbage)
        with pytest.raises(TypeError, match="takes its messages"):
            manager.ask(garbage, timeout=5)

    assert manager.is_alive()


def test_malformed_messages_that_reach_it_are_dropped_and_the_manager_lives(
    manager: ManagerRef, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="actors")
    forged: list[object] = [
        unchecked(TrackJob, job_id=None, token=None, ts=0),
        unchecked(TrackJob, job_id="j", token="", ts=0),
        unchecked(UntrackJob, job_id=""),
    ]
    for message in forged:
        manager.tell(message)
    track_job(manager, "j", "t")

    assert is_tracked(manager, "j", timeout=5)
    assert manager.is_alive()
    # Each bad track is dropped with a warning; an untrack of no id untracks nothing.
    dropped = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
    assert len(dropped) == 2 and all("TrackJob" in text for text in dropped), dropped


def test_a_proxy_checks_its_calls_in_the_callers_thread(manager: ManagerRef) -> None:
    proxy = manager.proxy()

    with pytest.raises(ValueError, match="token"):
        proxy.track_job("j", "")
    with pytest.raises(ValueError, match="token"):
        proxy.track_job.defer("j", "")
    with pytest.raises(AttributeError, match="no operation 'on_receive'"):
        proxy.on_receive("x")
    with pytest.raises(AttributeError, match="cannot be set"):
        proxy.queue_name = "other"

    assert manager.is_alive()


def test_stop_is_idempotent_and_tracking_after_stop_is_a_no_op(manager: ManagerRef) -> None:
    stop(manager)
    stop(manager)
    track_job(manager, "j", "t")
    untrack_job(manager, "j")
    untrack_job(manager, "j", wait=True)

    assert not manager.is_alive()
    with pytest.raises(ManagerStopped, match="LockManager for queue 'q' is stopped"):
        is_tracked(manager, "j")


def test_a_manager_class_started_directly_hands_out_a_checked_reference() -> None:
    ref = LockManager.start(connection=UNUSED_URL, keys=QueueKeys("q"))

    assert isinstance(ref, ManagerRef)
    with pytest.raises(ValueError, match="job_id"):
        ref.proxy().track_job("", "t")
    assert ref.is_alive()
