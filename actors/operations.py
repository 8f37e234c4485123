"""The manager's operations, written once: each one's name, message and handler.

Every door to a :class:`~actors.LockManager` is built from this table: the
reference lets in its messages and maps a proxy's method names to them
(:mod:`actors.admission`), the module helpers (:mod:`actors.api`) and the
awaitable ones (:mod:`actors.aio`) build their messages from it, and the
manager finds each message's handler through it. A new operation is a
message, an entry here and a handler on the manager.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from actors import messages as m

if TYPE_CHECKING:
    from actors.stats import Stats

__all__ = [
    "EXTEND_LOCKS",
    "GET_ACTIVE_JOB_COUNT",
    "GET_STATS",
    "GET_TRACKED_JOB_IDS",
    "IS_TRACKED",
    "MESSAGES",
    "OPERATIONS",
    "TRACK_JOB",
    "UNTRACK_JOB",
    "Operation",
    "by_name",
]

M = TypeVar("M")
R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class Operation(Generic[M, R]):
    """One operation: a message of type ``M`` whose answer is an ``R``."""

    #: The name of its module helper and of the method a proxy calls.
    name: str
    #: The message that carries it to the manager.
    message: type[M]
    #: The name of the manager's method that handles the message.
    handler: str

    def build(self, *args: Any, **kwargs: Any) -> M:
        """Build the message (which checks its arguments in the caller's thread).

        Raises:
            TypeError: An argument has the wrong type.
            ValueError: An argument is out of range.
        """
        return self.message(*args, **kwargs)


TRACK_JOB: Operation[m.TrackJob, Any] = Operation("track_job", m.TrackJob, "_on_track")
UNTRACK_JOB: Operation[m.UntrackJob, None] = Operation("untrack_job", m.UntrackJob, "_on_untrack")
GET_ACTIVE_JOB_COUNT: Operation[m.GetActiveJobCount, int] = Operation(
    "get_active_job_count", m.GetActiveJobCount, "_on_count"
)
GET_TRACKED_JOB_IDS: Operation[m.GetTrackedJobIds, list[str]] = Operation(
    "get_tracked_job_ids", m.GetTrackedJobIds, "_on_ids"
)
IS_TRACKED: Operation[m.IsTracked, bool] = Operation("is_tracked", m.IsTracked, "_on_is_tracked")
GET_STATS: Operation[m.GetStats, Stats] = Operation("get_stats", m.GetStats, "_on_stats")
EXTEND_LOCKS: Operation[m.ExtendLocks, None] = Operation(
    "extend_locks", m.ExtendLocks, "_on_extend"
)

#: Every operation, in the order the documentation lists them.
OPERATIONS: tuple[Operation[Any, Any], ...] = (
    TRACK_JOB,
    UNTRACK_JOB,
    GET_ACTIVE_JOB_COUNT,
    GET_TRACKED_JOB_IDS,
    IS_TRACKED,
    GET_STATS,
    EXTEND_LOCKS,
)

#: Every operation's message type.
MESSAGES: tuple[type, ...] = tuple(operation.message for operation in OPERATIONS)

_BY_NAME: dict[str, Operation[Any, Any]] = {operation.name: operation for operation in OPERATIONS}


def by_name(name: str) -> Operation[Any, Any] | None:
    """Return the operation called ``name``, or ``None`` if there is none."""
    return _BY_NAME.get(name)
