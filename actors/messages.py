"""The messages a :class:`~actors.LockManager` understands: the low-level door.

Each is a small immutable record, one per intent, for ``ActorRef.tell`` and
``ActorRef.ask``. Most code never builds them: the module helpers
(:func:`actors.track_job`, ...) and ``manager.proxy()`` do the same with less
typing. Job actors that already speak in messages may send them directly.

A message checks its own fields when it is built, so bad input fails in the
caller's thread, with the same ``TypeError`` or ``ValueError`` whichever door
it came through; a malformed message that reaches the manager anyway is
logged and dropped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from actors.validation import MAX_DURATION_MS, is_valid_text, require_int, require_text

__all__ = [
    "ExtendLocks",
    "GetActiveJobCount",
    "GetStats",
    "GetTrackedJobIds",
    "IsTracked",
    "Notify",
    "TrackJob",
    "UntrackJob",
]


#: The range of a monotonic time in milliseconds (``ts``, ``scheduled``).
_LOW, _HIGH = -(2**62), 2**62


class Notify(Protocol):
    """Anything with a ``tell``: a pykka ``ActorRef``, or a lease."""

    def tell(self, message: Any) -> None:
        """Deliver ``message``; must not block."""
        ...


@dataclass(frozen=True, slots=True)
class TrackJob:
    """Start renewing a job's lock (tell).

    Tracking a tracked job with a new token replaces the token and restarts
    its clock (a fresh lock); with the same token it changes nothing but
    adding its ``notify``, so a progress hook that tracks again never delays
    a renewal.
    """

    #: The job's id, as in its lock key ``{prefix}:{queue}:{job_id}:lock``.
    job_id: str
    #: The value the lock holds for this worker.
    token: str
    #: When the lock was taken, on the manager's monotonic clock, in
    #: milliseconds; ``None`` stamps it when the message is sent.
    ts: int | None = None
    #: Told :class:`~actors.LockLost` once if the lock is lost (with any other
    #: target the lock was tracked with); ``None`` for nobody.
    notify: Notify | None = None
    #: Most milliseconds to keep renewing the lock; ``None`` for the manager's
    #: ``max_hold``.
    max_hold: int | None = None

    def __post_init__(self) -> None:
        # The common case in one cheap test: a worker tracks by the thousand.
        if not (is_valid_text(self.job_id) and is_valid_text(self.token)):
            _set(self, "job_id", require_text(self.job_id, "job_id"))
            _set(self, "token", require_text(self.token, "token"))
        if self.ts is not None and not (type(self.ts) is int and _LOW <= self.ts <= _HIGH):
            _set(self, "ts", require_int(self.ts, "ts", minimum=_LOW, maximum=_HIGH))
        if self.notify is not None and not callable(getattr(self.notify, "tell", None)):
            raise TypeError(
                f"notify must have a tell() method (an ActorRef), got {type(self.notify).__name__}"
            )
        if self.max_hold is not None:
            _set(self, "max_hold", require_int(self.max_hold, "max_hold", maximum=MAX_DURATION_MS))


@dataclass(frozen=True, slots=True)
class UntrackJob:
    """Stop renewing a job's lock (tell; ask to wait until it is done). Unknown ids are ignored."""

    #: The job's id.
    job_id: str
    #: Untrack only the lock holding this token (a later lock of the job stays);
    #: ``None`` untracks whatever lock the job holds.
    token: str | None = None

    def __post_init__(self) -> None:
        if not is_valid_text(self.job_id):
            _set(self, "job_id", require_text(self.job_id, "job_id"))
        if self.token is not None:
            _set(self, "token", require_text(self.token, "token"))


@dataclass(frozen=True, slots=True)
class ExtendLocks:
    """Renew every due lock now.

    Sent without ``scheduled`` it is a "renew now": it renews what is due and
    leaves the timer alone. The manager's timer sends it with the time the
    tick was scheduled for, which keeps the ticks on their grid.
    """

    #: The grid time the timer fired for, in monotonic milliseconds.
    scheduled: int | None = None

    def __post_init__(self) -> None:
        if self.scheduled is not None:
            _set(
                self,
                "scheduled",
                require_int(self.scheduled, "scheduled", minimum=_LOW, maximum=_HIGH),
            )


@dataclass(frozen=True, slots=True)
class GetActiveJobCount:
    """Ask how many jobs are tracked; the reply is an ``int``."""


@dataclass(frozen=True, slots=True)
class GetTrackedJobIds:
    """Ask which jobs are tracked; the reply is a ``list[str]``."""


@dataclass(frozen=True, slots=True)
class IsTracked:
    """Ask whether one job is tracked; the reply is a ``bool``."""

    #: The job's id.
    job_id: str

    def __post_init__(self) -> None:
        _set(self, "job_id", require_text(self.job_id, "job_id"))


@dataclass(frozen=True, slots=True)
class GetStats:
    """Ask for the manager's counters; the reply is a :class:`~actors.Stats`."""


def _set(message: object, field: str, value: object) -> None:
    # A frozen dataclass's own way to store a checked value in __post_init__:
    # the plain str or int the check returned, never the caller's subclass.
    object.__setattr__(message, field, value)
