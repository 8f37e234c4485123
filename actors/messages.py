"""The messages a :class:`~actors.lock_manager.LockManager` understands.

Each is a small immutable record, one per intent, for ``ActorRef.tell`` and
``ActorRef.ask``. The helpers in :mod:`actors.lock_manager` validate their
arguments before sending; a message that reaches the actor malformed anyway
is logged and dropped.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "ExtendLocks",
    "GetActiveJobCount",
    "GetStats",
    "GetTrackedJobIds",
    "IsTracked",
    "TrackJob",
    "UntrackJob",
]


@dataclass(frozen=True, slots=True)
class TrackJob:
    """Start renewing a job's lock (tell). Replaces the token of a tracked job."""

    #: The job's id, as in its lock key ``{prefix}:{queue}:{job_id}:lock``.
    job_id: str
    #: The value the lock holds for this worker.
    token: str


@dataclass(frozen=True, slots=True)
class UntrackJob:
    """Stop renewing a job's lock (tell). Unknown ids are ignored."""

    #: The job's id.
    job_id: str


@dataclass(frozen=True, slots=True)
class ExtendLocks:
    """Renew every due lock now, then arm the timer again (the timer's message)."""


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


@dataclass(frozen=True, slots=True)
class GetStats:
    """Ask for the manager's counters; the reply is a :class:`~actors.stats.Stats`."""
