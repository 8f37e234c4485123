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
    """Claim a job's lock: renew it while any claim on its token holds (tell).

    Each target (``notify``, compared by identity) makes its own claim, with
    its own ``max_hold``; tracking without a target makes the plain claim.
    The same claim made again changes nothing, so a progress hook that
    tracks again never delays a renewal nor slides a deadline. A new token
    is a new lock: it replaces the old one, whose targets are told ``stolen``.
    A lock lost recently is not tracked again with the same token (a new
    target is told of the loss at once). A watched lock (one with a target)
    whose renewal is not confirmed by its deadline is let go, and every
    target told ``"unconfirmed"``. Asked, a track with a target answers the
    lock's ``actors.jobs.Validity`` (its deadline), or ``None``.
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
    #: Most milliseconds to keep renewing the lock for this claim; ``None``
    #: for the manager's ``max_hold``.
    max_hold: int | None = None
    #: End this claim only by an untrack that names ``notify`` (a lease's
    #: claim is kept so): an untrack without a target leaves it.
    keep: bool = False
    #: This claim's safety margin in milliseconds (needs ``notify``): the
    #: lock is trusted until ``lock_duration - safety_margin`` after its last
    #: confirmed renewal's send; ``None`` for the manager's ``safety_margin``.
    safety_margin: int | None = None

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
        if self.keep is not False:
            if type(self.keep) is not bool:
                raise TypeError(f"keep must be a bool, got {type(self.keep).__name__}")
            if self.notify is None:
                raise ValueError("keep=True needs a notify target: only its untrack ends the claim")
        if self.safety_margin is not None:
            _set(
                self,
                "safety_margin",
                require_int(
                    self.safety_margin, "safety_margin", minimum=0, maximum=MAX_DURATION_MS
                ),
            )
            if self.notify is None:
                raise ValueError("safety_margin needs a notify target: it is a watcher's margin")


@dataclass(frozen=True, slots=True)
class UntrackJob:
    """End claims on a job's lock (tell; ask to wait until it is done). Unknown ids are ignored.

    With ``notify`` it ends that target's claim alone. Without, it ends every
    claim but the kept ones (the leases'): the plain claim and each
    ``notify`` target's, untold. The lock is renewed while a claim remains.
    """

    #: The job's id.
    job_id: str
    #: Untrack only the lock holding this token (a later lock of the job stays);
    #: ``None`` untracks whatever lock the job holds.
    token: str | None = None
    #: End only the claim this target made (compared by identity); ``None``
    #: for every claim that is not kept.
    notify: Notify | None = None

    def __post_init__(self) -> None:
        if not is_valid_text(self.job_id):
            _set(self, "job_id", require_text(self.job_id, "job_id"))
        if self.token is not None:
            _set(self, "token", require_text(self.token, "token"))
        if self.notify is not None and not callable(getattr(self.notify, "tell", None)):
            raise TypeError(
                f"notify must have a tell() method (an ActorRef), got {type(self.notify).__name__}"
            )


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
