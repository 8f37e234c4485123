"""The manager's second look at a message it is handed, for fields written after it was built.

A message checks itself when it is built, but a frozen dataclass can still
be written to afterwards (``object.__setattr__``). The handlers look at the
types of what they keep or compare, with a few exact-type tests and no
rebuild: a caller's subclass never runs its code on the manager's thread,
and a forged message raises here, to be logged and dropped.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from actors.messages import ExtendLocks, IsTracked, TrackJob, UntrackJob
from actors.schedule import check_safety_margin
from actors.validation import is_valid_text

if TYPE_CHECKING:
    from actors.schedule import Timing

__all__ = ["recheck_is_tracked", "recheck_scheduled", "recheck_track", "recheck_untrack"]


def recheck_track(message: TrackJob, timing: Timing) -> int | None:
    """Check a :class:`~actors.TrackJob` again; return its margin, checked against ``timing``.

    Raises:
        TypeError: A field was changed to the wrong type.
        ValueError: A field was changed out of range, or does not fit ``timing``.
    """
    if not (is_valid_text(message.job_id) and is_valid_text(message.token)):
        TrackJob(message.job_id, message.token)  # raises, naming the bad argument
    if (
        not (_plain_int(message.ts) and _plain_int(message.max_hold))
        or type(message.keep) is not bool
    ):
        raise TypeError("a TrackJob's ts, max_hold or keep was changed after it was built")
    if message.keep and message.notify is None:
        raise ValueError("a TrackJob's keep was changed after it was built")
    margin = message.safety_margin
    if margin is None:
        return None
    if message.notify is None:
        raise ValueError("a TrackJob's safety_margin was changed after it was built")
    # Checked against this manager's windows.
    return check_safety_margin(margin, timing)


def recheck_untrack(message: UntrackJob) -> None:
    """Check an :class:`~actors.UntrackJob` again.

    Raises:
        TypeError: Its id or token was changed to something not a ``str``.
    """
    token = message.token
    if type(message.job_id) is not str or not (token is None or type(token) is str):
        raise TypeError("an UntrackJob was changed after it was built")


def recheck_is_tracked(message: IsTracked) -> None:
    """Check an :class:`~actors.IsTracked` again.

    Raises:
        TypeError: Its id was changed to something not a ``str``.
    """
    if type(message.job_id) is not str:
        raise TypeError("an IsTracked was changed after it was built")


def recheck_scheduled(message: ExtendLocks) -> int | None:
    """Return an :class:`~actors.ExtendLocks`'s grid time, checked again as when it was built.

    Raises:
        TypeError: It was changed to something not an ``int``.
        ValueError: It was changed out of range.
    """
    scheduled = message.scheduled
    return None if scheduled is None else ExtendLocks(scheduled).scheduled


def _plain_int(value: object) -> bool:
    return value is None or type(value) is int
