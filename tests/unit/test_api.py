"""The module helpers refuse bad input at the call site, naming the argument.

Nothing reaches Redis: the manager is started on a URL nobody listens on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pykka
import pytest

from actors import ManagerRef, QueueKeys, is_tracked, start_link, stop, track_job, untrack_job
from actors.timing import MAX_DURATION_MS, MAX_TEXT_BYTES

if TYPE_CHECKING:
    from tests.conftest import StartManager

# Nothing listens here: these tests must fail before any command is sent.
UNUSED_URL = "redis://127.0.0.1:1/0"


@pytest.fixture
def manager(start_manager: StartManager) -> ManagerRef:
    return start_manager(connection=UNUSED_URL, keys=QueueKeys("q"))


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
        ({"safety_margin": 30000 - 7500}, ValueError, "safety_margin"),
        ({"safety_margin": -1}, ValueError, "safety_margin"),
        ({"isolation": "fiber"}, ValueError, "isolation"),
        ({"isolation": 1}, TypeError, "isolation"),
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
