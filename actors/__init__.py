"""Job-lock renewal for EchoMQ and BullMQ queues on Redis.

One :class:`LockManager` actor per worker and queue keeps the locks of the
jobs the worker holds alive: one timer, one batched Lua call per tick.

Example:
    >>> from actors import QueueKeys, start_link, track_job, untrack_job, stop
    >>> manager = start_link(connection="redis://localhost:6379/0", keys=QueueKeys("myqueue"))
    >>> track_job(manager, "42", token)
    >>> untrack_job(manager, "42")
    >>> stop(manager)
"""

from __future__ import annotations

import logging

from actors.keys import DEFAULT_PREFIX, QueueKeys
from actors.lock_manager import (
    LockManager,
    get_active_job_count,
    get_stats,
    get_tracked_job_ids,
    is_tracked,
    start_link,
    stop,
    track_job,
    untrack_job,
)
from actors.messages import (
    ExtendLocks,
    GetActiveJobCount,
    GetStats,
    GetTrackedJobIds,
    IsTracked,
    TrackJob,
    UntrackJob,
)
from actors.schedule import DEFAULT_LOCK_DURATION, Timing
from actors.scripts import DEFAULT_MAX_BATCH, extend_locks
from actors.stats import Stats

__all__ = [
    "DEFAULT_LOCK_DURATION",
    "DEFAULT_MAX_BATCH",
    "DEFAULT_PREFIX",
    "ExtendLocks",
    "GetActiveJobCount",
    "GetStats",
    "GetTrackedJobIds",
    "IsTracked",
    "LockManager",
    "QueueKeys",
    "Stats",
    "Timing",
    "TrackJob",
    "UntrackJob",
    "__version__",
    "extend_locks",
    "get_active_job_count",
    "get_stats",
    "get_tracked_job_ids",
    "is_tracked",
    "start_link",
    "stop",
    "track_job",
    "untrack_job",
]

__version__ = "0.1.0"

logging.getLogger(__name__).addHandler(logging.NullHandler())
