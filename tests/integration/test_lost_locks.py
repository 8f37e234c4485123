"""Who is told of a lost lock, with what reason, on each engine's real server.

Every target of a lock is told exactly once; the reason (stolen or expired)
is read back from the server, and a lock that cannot be read back stays tracked.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import TYPE_CHECKING, Any

import pytest
import redis

from actors import (
    LockLost,
    ManagerRef,
    QueueKeys,
    get_stats,
    get_tracked_job_ids,
    is_tracked,
    lease,
    stop,
    track_job,
)
from actors.messages import STOLEN, UnconfirmedLossError
from tests.support import (
    INTERVAL_S,
    TTL,
    Inbox,
    Recorder,
    Server,
    alive,
    delivered,
    new_token,
    set_locks,
    settle,
    start_short,
    steal,
    take_locks,
    wait_for,
    wait_ticks,
    watch_locks,
)

if TYPE_CHECKING:
    from collections.abc import Iterator

    import redis

    from actors import ManagerRef

KEYS = QueueKeys("lost-locks")


#: The most a loss may take to be told, with room for a loaded machine: ten
#: intervals where one is the rule.
LEARN_S = 10 * INTERVAL_S


def _untracked(manager: ManagerRef, job_id: str) -> None:
    # The step that untracks the job decides who is told, so once a later
    # query sees it gone and the reports so far are delivered, everybody has been told.
    wait_for(lambda: not is_tracked(manager, job_id), LEARN_S, f"the loss of {job_id!r}")
    delivered(manager)


#: A ``max_hold`` off the tick grid, in ms: its deadline falls between two ticks.
MAX_HOLD = 3 * TTL // 4 + 7


#: Ample for a tick to run and report, on a loaded machine: ticks come every interval.
REPORT_S = 20 * INTERVAL_S


#: How long another holder's lock lives: past the end of the test, so that it
#: can only be found "stolen", never "expired".
THEIRS_MS = 50 * TTL


#: Ticks to let run after a report, to see that it is not repeated.
MORE_TICKS = 4


#: Another worker's lock value that is not UTF-8, whatever our token.
FOREIGN = b"\xff\xfeother-worker"


@pytest.fixture(params=[False, True], ids=["bytes-replies", "decoded-replies"])
def manager_client(
    request: pytest.FixtureRequest, engine_server: Server, engine_client: redis.Redis
) -> Iterator[redis.Redis]:
    """A client of the engine for the manager, with or without ``decode_responses``.

    It asks for ``engine_client`` so that the server is flushed around the test.
    """
    client = engine_server.client(decode_responses=request.param)
    yield client
    client.close()


@dataclasses.dataclass(frozen=True)
class _TakenOver:
    """A manager renewing ``"kept"`` after another holder took ``"taken"``'s lock."""

    manager: ManagerRef
    recorder: Recorder
    #: Each job's id and our token.
    tokens: dict[str, str]
    #: When the awaited report came (monotonic seconds), before :data:`MORE_TICKS` ticks ran.
    reported: float

    def assert_kept_renewed(self, client: redis.Redis) -> None:
        """Assert the other job is renewed after the report, and its lock holds our token.

        The ticks after the report may be quick retries of ``"taken"`` alone
        (a failed tick is retried soon): ``"kept"`` is due again within the
        renew window, so its next renewal is awaited.
        """
        kept = {"kept": self.tokens["kept"]}
        self.recorder.wait(
            lambda: self.recorder.renewed(since=self.reported)["kept"] >= 1,
            REPORT_S,
            "kept to be renewed after the report",
        )
        assert alive(client, KEYS, kept) == {"kept"}


def _take_over(
    engine_client: redis.Redis,
    manager_client: redis.Redis,
    theirs: bytes,
    awaited: str,
    token: str | None = None,
) -> _TakenOver:
    """Renew ``"taken"`` and ``"kept"``, let another holder write ``theirs`` on ``"taken"``.

    Returns once the recorder got ``awaited`` (``"lost"`` or ``"errors"``),
    :data:`MORE_TICKS` more ticks ran, and what they decided was delivered.
    """
    tokens = {"taken": token or new_token(), "kept": new_token()}
    set_locks(engine_client, KEYS, tokens, TTL)
    recorder = Recorder()
    manager = recorder.start(manager_client, KEYS, lock_duration=TTL)
    for job_id, held in tokens.items():
        track_job(manager, job_id, held)
    recorder.wait_renewed(tokens, REPORT_S)

    steal(engine_client, KEYS, "taken", THEIRS_MS, theirs)
    recorder.wait(getattr(recorder, awaited), REPORT_S, f"the {awaited} of the lock taken over")
    reported = time.monotonic()
    wait_ticks(manager, MORE_TICKS, timeout=MORE_TICKS * REPORT_S)
    delivered(manager)
    return _TakenOver(manager, recorder, tokens, reported)


def test_a_lost_lock_is_reported_with_its_token_reason_and_key(
    engine_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    recorder = Recorder()
    manager = start_short(engine_client, KEYS, **recorder.callbacks())
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


def test_a_lock_key_of_another_type_is_one_lost_job_and_the_rest_are_renewed(
    engine_client: redis.Redis,
) -> None:
    # GET on a hash raises inside the script: the job is reported stolen
    # and the script goes on with the others.
    recorder = Recorder()
    manager = start_short(engine_client, KEYS, **recorder.callbacks())
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


def test_a_lease_is_still_told_when_its_lock_is_tracked_with_another_target(
    engine_client: redis.Redis,
) -> None:
    """``track_job(..., notify=actor)`` of a leased lock (same token) leaves the lease told too.

    Each claim keeps its own target: when the lock is stolen, the actor is told
    and the lease reports ``lost`` and fails ``check()``.
    """
    manager = start_short(engine_client, KEYS, own_client=True)
    token = take_locks(engine_client, KEYS, ["j"], TTL)["j"]
    actor = Inbox()
    with lease(manager, "j", token) as held:
        track_job(manager, "j", token, notify=actor)  # the same lock, another target
        settle(manager)
        steal(engine_client, KEYS, "j", THEIRS_MS)
        assert held.wait(LEARN_S), "the lease was never told its lock was stolen"
        assert held.reason == "stolen"
        with pytest.raises(LockLost):
            held.check()
        wait_for(lambda: actor.got, LEARN_S, "the actor to be told")
    assert actor.got == [LockLost("j", token, "stolen")]


def test_every_target_of_a_lock_is_told_once_however_often_it_asked(
    engine_client: redis.Redis,
) -> None:
    """Each of two targets of one lock is told of its loss, once, however often it asked.

    ``a`` asks, ``b`` asks, ``a`` asks again and a progress hook re-tracks
    without a target: each of ``a`` and ``b`` hears of the loss exactly once,
    and nothing more in the ticks after.
    """
    manager = start_short(engine_client, KEYS, own_client=True)
    token = take_locks(engine_client, KEYS, ["j"], TTL)["j"]
    a, b = Inbox(), Inbox()
    track_job(manager, "j", token, notify=a)
    track_job(manager, "j", token, notify=b)
    track_job(manager, "j", token, notify=a)
    track_job(manager, "j", token)  # a progress hook
    settle(manager)

    steal(engine_client, KEYS, "j", THEIRS_MS)
    _untracked(manager, "j")
    wait_ticks(manager, 2, LEARN_S)
    delivered(manager)

    lost = LockLost("j", token, "stolen")
    assert (a.got, b.got) == ([lost], [lost])


def test_a_new_token_tells_every_target_of_the_old_lock(engine_client: redis.Redis) -> None:
    """When a new token replaces a lock with two targets, both are told.

    The job was taken again (another run holds it now): each target of the old
    lock hears ``"stolen"`` with the old token, at once. The new lock starts
    afresh: only its own target hears of its loss later.
    """
    manager = start_short(engine_client, KEYS, own_client=True)
    old = take_locks(engine_client, KEYS, ["j"], TTL)["j"]
    a, b, c = Inbox(), Inbox(), Inbox()
    track_job(manager, "j", old, notify=a)
    track_job(manager, "j", old, notify=b)
    engine_client.set(KEYS.lock("j"), "new-token", px=TTL)  # the job is taken again
    track_job(manager, "j", "new-token", notify=c)
    delivered(manager)

    replaced = LockLost("j", old, "stolen")
    assert (a.got, b.got, c.got) == ([replaced], [replaced], [])
    assert is_tracked(manager, "j")

    steal(engine_client, KEYS, "j", THEIRS_MS)
    _untracked(manager, "j")
    assert (a.got, b.got, c.got) == ([replaced], [replaced], [LockLost("j", "new-token", "stolen")])


def test_max_hold_tells_every_target(engine_client: redis.Redis) -> None:
    """A lock with two targets let go at its ``max_hold`` tells both.

    The deadline is the first track's (adding a target does not slide it).
    """
    manager = start_short(engine_client, KEYS, own_client=True)
    token = take_locks(engine_client, KEYS, ["j"], 10 * TTL)["j"]
    a, b = Inbox(), Inbox()
    track_job(manager, "j", token, notify=a, max_hold=MAX_HOLD)
    track_job(manager, "j", token, notify=b, max_hold=MAX_HOLD)

    wait_for(
        lambda: not is_tracked(manager, "j"),
        MAX_HOLD / 1000 + LEARN_S,
        "the job to be let go at its max_hold",
    )
    delivered(manager)

    lost = LockLost("j", token, "max_hold")
    assert (a.got, b.got) == ([lost], [lost])


def test_a_stopping_manager_tells_every_target(engine_client: redis.Redis) -> None:
    """A manager that stops tells every target of each lock.

    Nobody renews the lock from then on: each target hears
    ``"manager_stopped"``, once.
    """
    manager = start_short(engine_client, KEYS, own_client=True)
    token = take_locks(engine_client, KEYS, ["j"], TTL)["j"]
    a, b = Inbox(), Inbox()
    track_job(manager, "j", token, notify=a)
    track_job(manager, "j", token, notify=b)
    settle(manager)

    stop(manager)

    lost = LockLost("j", token, "manager_stopped")
    assert (a.got, b.got) == ([lost], [lost])


@pytest.mark.parametrize(
    ("token", "theirs"),
    [
        pytest.param(None, FOREIGN, id="foreign-bytes"),
        # Decoded with replacement, b"\xff" reads as our token "\ufffd".
        pytest.param("\ufffd", b"\xff", id="token-U+FFFD"),
    ],
)
def test_a_lock_taken_over_with_bytes_that_are_not_utf8_is_reported_stolen(
    engine_client: redis.Redis, manager_client: redis.Redis, token: str | None, theirs: bytes
) -> None:
    """A lock another holder took with bytes that are not UTF-8 is reported stolen.

    Values are compared as raw bytes, whatever the client's
    ``decode_responses``: foreign bytes are another holder's (never a reply that
    cannot be read), and ``b"\xff"`` never equals a token ``"\ufffd"``.
    """
    run = _take_over(engine_client, manager_client, theirs, "lost", token)

    lost = [(item.job_id, item.token, item.reason) for item in run.recorder.lost()]
    assert lost == [("taken", run.tokens["taken"], STOLEN)], "reported once, as stolen"
    assert not is_tracked(run.manager, "taken")
    assert run.recorder.errors() == [], "a lock taken over is no failed tick"
    run.assert_kept_renewed(engine_client)
    assert engine_client.get(KEYS.lock("taken")) == theirs, "the other holder's lock was touched"
    assert get_stats(run.manager).errors == 0


def test_a_read_back_failing_with_no_redis_error_keeps_the_job_and_says_so(
    engine_server: Server, engine_client: redis.Redis
) -> None:
    """A read-back raising anything but a RedisError keeps the job tracked and says so.

    The renewals the script made still count (``on_locks_renewed``,
    ``renewed``); the job whose lock could not be read back stays tracked (its
    lock is in an unknown state), and ``on_error`` gets an
    :class:`UnconfirmedLossError` each tick.
    """

    class ReplyRefused(Exception):
        """What the client's own GET reply callback raises."""

    def refuse(response: Any, **options: Any) -> Any:
        raise ReplyRefused(f"cannot parse {response!r}")

    client = engine_server.client()
    # A user's client may parse replies its own way; here GET's parsing fails.
    client.set_response_callback("GET", refuse)
    try:
        run = _take_over(engine_client, client, FOREIGN, "errors")

        errors = run.recorder.errors()
        # One at the first tick that found the lock taken, one at each tick after.
        assert len(errors) >= 1 + MORE_TICKS, errors
        assert all(isinstance(error, UnconfirmedLossError) for error in errors), errors
        assert all(isinstance(error.__cause__, ReplyRefused) for error in errors), errors
        assert is_tracked(run.manager, "taken"), "a job whose lock may be held was dropped"
        assert run.recorder.lost() == [], "a loss nobody could confirm was reported"
        run.assert_kept_renewed(engine_client)
    finally:
        client.close()
