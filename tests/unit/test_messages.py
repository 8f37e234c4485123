"""The messages: each checks its fields at the caller; a lost lock is said one way everywhere."""

from __future__ import annotations

import pickle
from typing import Any

import pytest

from actors import ExtendLocks, LockLost, LostLock, TrackJob, UntrackJob, messages
from actors.messages import BY_NAME, MESSAGES, STOLEN, UNCONFIRMED, IsTracked
from tests.support import Silent

# -- the claim fields -------------------------------------------------------------


def test_keep_must_be_a_bool() -> None:
    with pytest.raises(TypeError, match="keep"):
        TrackJob("j", "t", notify=Silent(), keep=1)  # type: ignore[arg-type]


def test_keep_needs_a_target_whose_untrack_ends_it() -> None:
    with pytest.raises(ValueError, match="keep=True needs a notify"):
        TrackJob("j", "t", keep=True)


def test_a_safety_margin_needs_a_target_whose_margin_it_is() -> None:
    with pytest.raises(ValueError, match="safety_margin needs a notify"):
        TrackJob("j", "t", safety_margin=100)
    with pytest.raises(ValueError, match="safety_margin"):
        TrackJob("j", "t", notify=Silent(), safety_margin=-1)


def test_releasing_must_be_a_bool() -> None:
    with pytest.raises(TypeError, match="releasing"):
        TrackJob("j", "t", releasing=1)  # type: ignore[arg-type]


def test_an_untrack_names_its_target_by_something_with_tell() -> None:
    with pytest.raises(TypeError, match="notify"):
        UntrackJob("j", "t", notify="someone")  # type: ignore[arg-type]
    assert UntrackJob("j", "t", notify=Silent()).token == "t"


@pytest.mark.parametrize(
    ("build", "error", "argument"),
    [
        (lambda: TrackJob(None, None), TypeError, "job_id"),  # type: ignore[arg-type]
        (lambda: TrackJob("j", ""), ValueError, "token"),
        (lambda: TrackJob("j", "t", ts=2**63), ValueError, "ts"),
        (lambda: UntrackJob(""), ValueError, "job_id"),
        (lambda: UntrackJob("j", ""), ValueError, "token"),
        (lambda: IsTracked(7), TypeError, "job_id"),  # type: ignore[arg-type]
        (lambda: ExtendLocks(1.5), TypeError, "scheduled"),  # type: ignore[arg-type]
    ],
)
def test_a_malformed_message_cannot_be_built(
    build: Any, error: type[Exception], argument: str
) -> None:
    with pytest.raises(error, match=argument):
        build()


class Id(str):
    """A caller's ``str`` subclass."""

    __slots__ = ()


def test_a_message_keeps_plain_values_never_the_callers_subclass() -> None:
    message = TrackJob(Id("j"), Id("t"))

    assert type(message.job_id) is str and type(message.token) is str
    assert message == TrackJob("j", "t")


# -- the list of messages ---------------------------------------------------------


def test_every_message_is_listed_once_under_its_own_operation_name() -> None:
    declared = {
        getattr(messages, name)
        for name in messages.__all__
        if isinstance(getattr(messages, name), type)
        and getattr(messages, name).__module__ == messages.__name__
    } - {
        messages.Notify,
        LockLost,
        LostLock,
        messages.Renewer,
        messages.BatchOutcome,
        messages.ChunkError,
        messages.UnconfirmedLossError,
        messages.NotReplicatedError,
    }

    assert sorted(kind.__name__ for kind in MESSAGES) == sorted(kind.__name__ for kind in declared)
    assert len(set(MESSAGES)) == len(MESSAGES) == len(BY_NAME)
    for kind in MESSAGES:
        assert BY_NAME[kind.operation] is kind  # type: ignore[attr-defined]


# -- a lost lock --------------------------------------------------------------------


def test_a_lock_lost_is_equal_by_job_token_and_reason_not_by_detail() -> None:
    lost = LockLost("j", "t", STOLEN, "found 10 ms after its last renewal")

    assert lost == LockLost("j", "t", STOLEN)
    assert hash(lost) == hash(LockLost("j", "t", STOLEN, "other words"))
    assert lost != LockLost("j", "t2", STOLEN)
    assert lost != LockLost("j", "t", UNCONFIRMED)
    assert str(lost) == "the lock of job 'j' is lost (stolen): found 10 ms after its last renewal"
    assert str(LockLost("j", "t", STOLEN)) == "the lock of job 'j' is lost (stolen)"


def test_a_lost_lock_is_the_plain_id_carrying_its_loss() -> None:
    loss = LockLost("42", "t", UNCONFIRMED, "no renewal confirmed")

    lost = LostLock(loss)

    # A callback written for a list of ids keeps working ...
    assert lost == "42" and hash(lost) == hash("42") and str(lost) == "42"
    assert "42" in {lost} and lost in {"42"}
    # ... and one that wants more reads the loss through it.
    assert lost.lost is loss
    assert (lost.job_id, lost.token, lost.reason, lost.detail) == (
        "42",
        "t",
        UNCONFIRMED,
        "no renewal confirmed",
    )
    assert type(lost.job_id) is str


def test_a_lost_lock_crosses_a_process_whole() -> None:
    lost = LostLock(LockLost("42", "t", STOLEN, "seen"))

    again = pickle.loads(pickle.dumps(lost))

    assert isinstance(again, LostLock) and again == "42"
    assert (again.token, again.reason, again.detail) == ("t", STOLEN, "seen")
    loss = pickle.loads(pickle.dumps(lost.lost))
    assert loss == lost.lost and loss.detail == "seen"
