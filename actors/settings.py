"""A manager's keywords, checked in the caller's thread before the actor exists.

:func:`check_settings` raises ``TypeError``/``ValueError`` naming the bad
argument, in the order :class:`~actors.LockManager` lists them, and builds
the default renewer (the shared script on ``connection``) when none is given.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from actors.keys import QueueKeys
from actors.renewer import RedisRenewer
from actors.schedule import Timing, check_safety_margin, default_safety_margin
from actors.validation import MAX_DURATION_MS, require_callback, require_int

if TYPE_CHECKING:
    from collections.abc import Callable

    from actors.connection import Client
    from actors.renewer import Renewer
    from actors.timer import TimerFactory

__all__ = ["Settings", "check_settings"]


@dataclass(frozen=True, slots=True)
class Settings:
    """What a manager runs with, each value checked (see :class:`~actors.LockManager`)."""

    #: The lock TTL and the windows derived from it.
    timing: Timing
    #: The default safety margin of a watched lock, in milliseconds.
    safety_margin: int
    #: Most ids per script call.
    max_batch: int
    #: Most milliseconds any job's lock is renewed, or ``None``.
    max_hold: int | None
    #: What renews the locks.
    renewer: Renewer

    def trusted_for(self, safety_margin: int | None = None) -> int:
        """Return how long a watched lock is trusted after a confirmed renewal's send, in ms.

        Thread-safe: it reads only what never changes.

        Args:
            safety_margin: A lease's own margin in milliseconds, or ``None``
                for the manager's.

        Raises:
            TypeError: ``safety_margin`` is not an ``int``.
            ValueError: It is negative, or leaves less than one interval.
        """
        timing = self.timing
        if safety_margin is None:
            return timing.lock_duration - self.safety_margin
        return timing.lock_duration - check_safety_margin(safety_margin, timing)


def check_settings(
    *,
    connection: Client | str | None,
    keys: QueueKeys,
    lock_duration: int,
    lock_renew_time: int | None,
    on_lock_renewal_failed: Callable[..., object] | None,
    on_locks_renewed: Callable[..., object] | None,
    on_error: Callable[..., object] | None,
    max_batch: int,
    max_hold: int | None,
    renewer: Renewer | None,
    clock: Callable[[], int] | None,
    timer: TimerFactory | None,
    safety_margin: int | None,
) -> Settings:
    """Check a manager's keywords; build its renewer on ``connection`` unless one is given.

    Args:
        connection: A client or a Redis URL, or ``None`` with ``renewer``.
        keys: The queue's keys.
        lock_duration: The lock TTL, in milliseconds.
        lock_renew_time: Longest time between two renewals, or ``None``.
        on_lock_renewal_failed: Called with the lost jobs, or ``None``.
        on_locks_renewed: Called with the renewed ids, or ``None``.
        on_error: Called with a failed tick's error, or ``None``.
        max_batch: Most ids per script call.
        max_hold: Most milliseconds any lock is renewed, or ``None``.
        renewer: What renews the locks, or ``None`` for the shared script.
        clock: The monotonic clock in milliseconds, or ``None``.
        timer: The timer factory, or ``None``.
        safety_margin: The watched locks' margin in milliseconds, or ``None``.

    Raises:
        TypeError: An argument has the wrong type.
        ValueError: A duration is out of range, the client's encoding is not
            UTF-8, or the queue's keys cannot live in one hash slot of the
            cluster client given.
    """
    if not isinstance(keys, QueueKeys):
        raise TypeError(f"keys must be a QueueKeys, got {type(keys).__name__}")
    timing = Timing(lock_duration, lock_renew_time)
    safety_margin = (
        default_safety_margin(timing)
        if safety_margin is None
        else check_safety_margin(safety_margin, timing)
    )
    require_callback(on_lock_renewal_failed, "on_lock_renewal_failed")
    require_callback(on_locks_renewed, "on_locks_renewed")
    require_callback(on_error, "on_error")
    require_callback(clock, "clock")
    if clock is not None and (isinstance(probe := clock(), bool) or not isinstance(probe, int)):
        raise TypeError(
            f"clock must return int milliseconds (as time.monotonic_ns() // 1_000_000), "
            f"got {type(probe).__name__}"
        )
    require_callback(timer, "timer")
    if max_hold is not None:
        max_hold = require_int(max_hold, "max_hold", maximum=MAX_DURATION_MS)
    max_batch = require_int(max_batch, "max_batch")
    if renewer is None:
        if connection is None:
            raise TypeError("connection is required (a redis.Redis, a RedisCluster or a URL)")
        renewer = RedisRenewer(connection, keys, timing.lock_duration, timing.interval, max_batch)
    elif connection is not None:
        raise TypeError("pass connection or renewer, not both")
    elif not callable(renewer):
        raise TypeError(f"renewer must be callable, got {type(renewer).__name__}")
    return Settings(timing, safety_margin, max_batch, max_hold, renewer)
