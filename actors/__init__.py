"""Job-lock renewal for EchoMQ and BullMQ queues on Redis.

One :class:`LockManager` actor per worker and queue keeps the locks of the
jobs the worker holds alive: one timer, one batched Lua call per tick.

Example:
    >>> from actors import QueueKeys, start_link, track_job, untrack_job, stop
    >>> manager = start_link(connection="redis://localhost:6379/0", keys=QueueKeys("myqueue"))
    >>> track_job(manager, "42", token)
    >>> untrack_job(manager, "42", wait=True)
    >>> stop(manager)

The layers, each importing only from those above it in this list: pure logic
(:mod:`~actors.validation`, :mod:`~actors.keys`, :mod:`~actors.schedule`,
:mod:`~actors.messages`, :mod:`~actors.rechecks`, :mod:`~actors.lost`,
:mod:`~actors.stats`, :mod:`~actors.claims`, :mod:`~actors.validity`,
:mod:`~actors.recently_lost`, :mod:`~actors.jobs`, :mod:`~actors.tally`,
:mod:`~actors.deadlines`, :mod:`~actors.tracking`, :mod:`~actors.operations`);
Redis I/O (:mod:`~actors.describe`, :mod:`~actors.connection`,
:mod:`~actors.outcome`, :mod:`~actors.evalsha`, :mod:`~actors.readback`,
:mod:`~actors.scripts`, :mod:`~actors.renewer`, :mod:`~actors.apply`); the
actor (:mod:`~actors.timer`, :mod:`~actors.alarm`, :mod:`~actors.mailbox`,
:mod:`~actors.answer`, :mod:`~actors.admission`, :mod:`~actors.ref`,
:mod:`~actors.stopping`, :mod:`~actors.report`, :mod:`~actors._shared`,
:mod:`~actors._spawn`, :mod:`~actors._forward`, :mod:`~actors._link`,
:mod:`~actors.isolation`, :mod:`~actors.settings`, :mod:`~actors.doors`,
:mod:`~actors.handlers`, :mod:`~actors.lock_manager`, :mod:`~actors.api`,
:mod:`~actors.aio`, :mod:`~actors.lease_wait`, :mod:`~actors.lease_hold`,
:mod:`~actors.leases`); tools (:mod:`~actors._child_io`, :mod:`~actors._child`,
:mod:`~actors.embedded`, :mod:`~actors.cli`, :mod:`~actors.bullmq`).
``tests/unit/test_layers.py`` keeps it so.

One word per act and layer: the shared script and what mirrors it keep
BullMQ's word, "extend" (``extendLocks-1.lua``, ``ExtendLocks``,
``extend_locks``), so a reader can match them with every other runtime;
everything of this package's own says "renew".
"""

from __future__ import annotations

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
from actors.keys import DEFAULT_PREFIX, QueueKeys
from actors.leases import Lease, lease
from actors.lock_manager import LockManager
from actors.lost import LockLost, LostLock
from actors.messages import (
    ExtendLocks,
    GetActiveJobCount,
    GetStats,
    GetTrackedJobIds,
    IsTracked,
    TrackJob,
    UntrackJob,
)
from actors.ref import ManagerRef, ManagerStopped
from actors.renewer import RedisRenewer, Renewer
from actors.schedule import DEFAULT_LOCK_DURATION, Timing
from actors.scripts import DEFAULT_MAX_BATCH, extend_locks
from actors.stats import Stats
from actors.timer import ManualTimer, ThreadTimer, Timer

__all__ = [  # noqa: RUF022 (grouped by purpose, as pykka does)
    # The manager and its helpers
    "LockManager",
    "ManagerRef",
    "ManagerStopped",
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
    # Messages (the low-level door)
    "ExtendLocks",
    "GetActiveJobCount",
    "GetStats",
    "GetTrackedJobIds",
    "IsTracked",
    "TrackJob",
    "UntrackJob",
    # Keys, timing, counters
    "DEFAULT_LOCK_DURATION",
    "DEFAULT_PREFIX",
    "QueueKeys",
    "Stats",
    "Timing",
    # Seams: what renews, and what ticks
    "DEFAULT_MAX_BATCH",
    "ManualTimer",
    "RedisRenewer",
    "Renewer",
    "ThreadTimer",
    "Timer",
    "extend_locks",
    "__version__",
]

__version__ = "0.2.0"

logging.getLogger(__name__).addHandler(logging.NullHandler())
