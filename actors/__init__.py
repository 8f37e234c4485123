"""Job-lock renewal for EchoMQ and BullMQ queues on Redis.

One :class:`LockManager` actor per worker and queue keeps the locks of the
jobs the worker holds alive: one timer, one batched Lua call per tick.

Example:
    >>> from actors import QueueKeys, start_link, track_job, untrack_job, stop
    >>> manager = start_link(connection="redis://localhost:6379/0", keys=QueueKeys("myqueue"))
    >>> track_job(manager, "42", token)
    >>> untrack_job(manager, "42", wait=True)
    >>> stop(manager)

The shared script and what mirrors it keep BullMQ's word, "extend"
(``extendLocks-1.lua``, ``ExtendLocks``, ``extend_locks``); the rest says "renew".
"""

from __future__ import annotations

import importlib.metadata
import logging

from actors.api import (
    get_active_job_count,
    get_stats,
    get_tracked_job_ids,
    is_tracked,
    start_link,
    stop,
    track_job,
    untrack_job,
)
from actors.fencing import fence, guarded, release
from actors.keys import DEFAULT_PREFIX, QueueKeys
from actors.leases import Lease, lease
from actors.lock_manager import LockManager
from actors.messages import (
    BatchOutcome,
    ChunkError,
    ExtendLocks,
    GetActiveJobCount,
    GetStats,
    GetTrackedJobIds,
    IsTracked,
    LockLost,
    LostLock,
    NotReplicatedError,
    Renewer,
    TrackJob,
    UntrackJob,
)
from actors.process import ProcessLockManager
from actors.ref import ManagerRef, ManagerStopped
from actors.report import Stats
from actors.scripts import DEFAULT_MAX_BATCH, RedisRenewer, Replicas, extend_locks
from actors.timer import ManualTimer, ThreadTimer, Timer, TimerFactory
from actors.timing import DEFAULT_LOCK_DURATION, Timing

__all__ = [  # noqa: RUF022 (grouped by purpose, as pykka does)
    # The manager and its helpers
    "LockManager",
    "ManagerRef",
    "ManagerStopped",
    "ProcessLockManager",
    "get_active_job_count",
    "get_stats",
    "get_tracked_job_ids",
    "is_tracked",
    "start_link",
    "stop",
    "track_job",
    "untrack_job",
    # Leases and lost locks
    "Lease",
    "LockLost",
    "LostLock",
    "lease",
    # Fencing: a stale holder's writes refused
    "fence",
    "guarded",
    "release",
    # Messages (the low-level door)
    "ExtendLocks",
    "GetActiveJobCount",
    "GetStats",
    "GetTrackedJobIds",
    "IsTracked",
    "TrackJob",
    "UntrackJob",
    # Replicas: writes confirmed by them
    "NotReplicatedError",
    "Replicas",
    # Keys, timing, counters
    "DEFAULT_LOCK_DURATION",
    "DEFAULT_PREFIX",
    "QueueKeys",
    "Stats",
    "Timing",
    # Seams: what renews, and what ticks
    "BatchOutcome",
    "ChunkError",
    "DEFAULT_MAX_BATCH",
    "ManualTimer",
    "RedisRenewer",
    "Renewer",
    "ThreadTimer",
    "Timer",
    "TimerFactory",
    "extend_locks",
    "__version__",
]

try:  # pyproject.toml is the one place the version is written
    __version__ = importlib.metadata.version("echomq-actors")
except importlib.metadata.PackageNotFoundError:  # pragma: no cover - a checkout, not installed
    __version__ = "0+unknown"

logging.getLogger(__name__).addHandler(logging.NullHandler())
