"""Bad input fails at the call site, naming the argument; nothing reaches Redis."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pykka
import pytest

from actors import (
    LockManager,
    QueueKeys,
    is_tracked,
    start_link,
    stop,
    track_job,
    untrack_job,
)

# Nothing listens here: these tests must fail before any command is sent.
UNUSED_URL = "redis://127.0.0.1:1/0"


@pytest.fixture
def manager() -> Iterator[pykka.ActorRef[LockManager]]:
    ref = start_link(connection=UNUSED_URL, keys=QueueKeys("q"))
    yield ref
    stop(ref)


@pytest.mark.parametrize(
    ("job_id", "token", "error", "argument"),
    [
        ("", "t", ValueError, "job_id"),
        (None, "t", TypeError, "job_id"),
        (42, "t", TypeError, "job_id"),
        ("j", "", ValueError, "token"),
        ("j", None, TypeError, "token"),
        ("j", b"t", TypeError, "token"),
    ],
)
def test_track_job_refuses_bad_ids_and_tokens(
    manager: pykka.ActorRef[LockManager],
    job_id: Any,
    token: Any,
    error: type[Exception],
    argument: str,
) -> None:
    with pytest.raises(error, match=argument):
        track_job(manager, job_id, token)


@pytest.mark.parametrize("job_id", ["", None, 7])
def test_untrack_and_is_tracked_refuse_bad_ids(
    manager: pykka.ActorRef[LockManager], job_id: Any
) -> None:
    with pytest.raises((TypeError, ValueError), match="job_id"):
        untrack_job(manager, job_id)
    with pytest.raises((TypeError, ValueError), match="job_id"):
        is_tracked(manager, job_id)


@pytest.mark.parametrize(
    ("options", "error", "argument"),
    [
        ({"lock_duration": 0}, ValueError, "lock_duration"),
        ({"lock_duration": "30000"}, TypeError, "lock_duration"),
        ({"lock_duration": 1000, "lock_renew_time": 1000}, ValueError, "lock_renew_time"),
        ({"lock_duration": 1000, "lock_renew_time": 1}, ValueError, "lock_renew_time"),
        ({"max_batch": 0}, ValueError, "max_batch"),
        ({"max_batch": 2.5}, ValueError, "max_batch"),
        ({"on_error": "log"}, TypeError, "on_error"),
        ({"on_lock_renewal_failed": 1}, TypeError, "on_lock_renewal_failed"),
        ({"on_locks_renewed": []}, TypeError, "on_locks_renewed"),
        ({"keys": "q"}, TypeError, "keys"),
        ({"connection": 6379}, TypeError, "connection"),
    ],
)
def test_start_link_refuses_bad_options(
    options: dict[str, Any], error: type[Exception], argument: str
) -> None:
    arguments: dict[str, Any] = {"connection": UNUSED_URL, "keys": QueueKeys("q"), **options}

    with pytest.raises(error, match=argument):
        start_link(**arguments)

    assert pykka.ActorRegistry.get_all() == []


def test_a_bad_url_is_refused_at_start() -> None:
    with pytest.raises(ValueError, match="redis://"):
        start_link(connection="http://example", keys=QueueKeys("q"))


def test_malformed_messages_do_not_kill_the_manager(manager: pykka.ActorRef[LockManager]) -> None:
    from actors.messages import TrackJob, UntrackJob

    for garbage in ("garbage", None, 42, TrackJob(None, None), UntrackJob(""), object()):  # type: ignore[arg-type]
        manager.tell(garbage)
    track_job(manager, "j", "t")

    assert is_tracked(manager, "j", timeout=5)
    assert manager.is_alive()


def test_stop_is_idempotent_and_tracking_after_stop_is_a_no_op(
    manager: pykka.ActorRef[LockManager],
) -> None:
    stop(manager)
    stop(manager)
    track_job(manager, "j", "t")
    untrack_job(manager, "j")

    assert not manager.is_alive()
    with pytest.raises(pykka.ActorDeadError):
        is_tracked(manager, "j")
