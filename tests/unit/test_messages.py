"""The claim fields of the track and untrack messages refuse bad input at the caller."""

from __future__ import annotations

import pytest

from actors import TrackJob, UntrackJob


class Target:
    """A ``notify`` target: only its ``tell`` matters here."""

    def tell(self, message: object) -> None:
        """Accept the message."""


def test_keep_must_be_a_bool() -> None:
    with pytest.raises(TypeError, match="keep"):
        TrackJob("j", "t", notify=Target(), keep=1)  # type: ignore[arg-type]


def test_keep_needs_a_target_whose_untrack_ends_it() -> None:
    with pytest.raises(ValueError, match="keep=True needs a notify"):
        TrackJob("j", "t", keep=True)


def test_an_untrack_names_its_target_by_something_with_tell() -> None:
    with pytest.raises(TypeError, match="notify"):
        UntrackJob("j", "t", notify="someone")  # type: ignore[arg-type]
    assert UntrackJob("j", "t", notify=Target()).token == "t"
