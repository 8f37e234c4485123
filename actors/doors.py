"""The manager's operations as methods, for a pykka proxy (``manager.proxy()``).

pykka's proxy sees only the actor's own attributes, so
:class:`~actors.LockManager` inherits these. The manager's reference turns
each proxy call into its message before it leaves the caller's thread (see
:mod:`actors.admission`); these methods run only for a plain pykka path
around it, and hand each call to the manager's one dispatch path.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Protocol

from actors.messages import (
    ExtendLocks,
    GetActiveJobCount,
    GetStats,
    GetTrackedJobIds,
    TrackJob,
    UntrackJob,
)

if TYPE_CHECKING:
    from actors.jobs import JobTable
    from actors.messages import Notify
    from actors.stats import Stats

__all__ = ["ProxyDoors"]

logger = logging.getLogger("actors.lock_manager")


class _Manager(Protocol):
    """What the doors need of the manager."""

    queue_name: str
    _jobs: JobTable

    def handle(self, message: Any) -> Any:
        """Handle ``message`` on the manager's thread."""
        ...


class ProxyDoors:
    """One method per operation; each builds its message and handles it."""

    def track_job(
        self: _Manager,
        job_id: str,
        token: str,
        ts: int | None = None,
        notify: Notify | None = None,
        max_hold: int | None = None,
        keep: bool = False,
    ) -> None:
        """Renew ``job_id``'s lock, held with ``token`` (see :class:`~actors.TrackJob`)."""
        _guarded(self, TrackJob, job_id, token, ts, notify, max_hold, keep)

    def untrack_job(
        self: _Manager, job_id: str, token: str | None = None, notify: Notify | None = None
    ) -> None:
        """End claims on ``job_id``'s lock (see :class:`~actors.UntrackJob`)."""
        _guarded(self, UntrackJob, job_id, token, notify)

    def get_active_job_count(self: _Manager) -> int:
        """Return how many jobs are tracked."""
        count: int = self.handle(GetActiveJobCount())
        return count

    def get_tracked_job_ids(self: _Manager) -> list[str]:
        """Return the ids of the tracked jobs."""
        ids: list[str] = self.handle(GetTrackedJobIds())
        return ids

    def is_tracked(self: _Manager, job_id: str) -> bool:
        """Return whether ``job_id`` is tracked."""
        return job_id in self._jobs

    def get_stats(self: _Manager) -> Stats:
        """Return a snapshot of the manager's counters."""
        stats: Stats = self.handle(GetStats())
        return stats

    def extend_locks(self: _Manager) -> None:
        """Renew every due lock now; the timer's grid is left alone."""
        self.handle(ExtendLocks())


def _guarded(manager: _Manager, kind: type, *args: Any) -> None:
    """Build the message and handle it; one whose arguments are bad is logged and dropped."""
    try:
        message = kind(*args)
    except (TypeError, ValueError) as error:
        logger.warning(
            "LockManager for queue %r dropped a %s: %s", manager.queue_name, kind.__name__, error
        )
        return
    manager.handle(message)
