"""The timing rules of lock renewal, as pure functions.

Three windows, all in milliseconds:

- ``lock_duration``: the lock's TTL (default 30000);
- ``lock_renew_time``: how often each lock is renewed at the latest
  (default ``lock_duration // 2``);
- the timer interval and the due threshold, both ``lock_renew_time // 2``.

A job is due when ``ts + threshold < now``, strictly. With interval equal to
threshold, a job is renewed every one or two ticks, so it waits at most
``lock_renew_time`` (plus one tick's delay) between renewals, well inside its
``lock_duration``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from itertools import compress
from typing import TYPE_CHECKING

from actors.validation import MAX_DURATION_MS, require_int

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = [
    "DEFAULT_LOCK_DURATION",
    "MIN_REDIS_LOCK_DURATION",
    "Timing",
    "check_lock_duration",
    "check_safety_margin",
    "default_safety_margin",
    "due_mask",
    "monotonic_ms",
    "next_deadline",
    "select_due",
]

#: Default lock TTL, in milliseconds, as every EchoMQ and BullMQ runtime uses.
DEFAULT_LOCK_DURATION = 30000

#: Shortest lock a manager sets on a Redis server, in milliseconds. Below it
#: the lock's margin at its latest renewal (half of it, by default) is shorter
#: than a single ordinary pause of the process or the server (a collection, a
#: fork for a snapshot, one retransmitted packet), and the value is far more
#: likely seconds typed for milliseconds (``lock_duration=30``) than meant.
MIN_REDIS_LOCK_DURATION = 100


def monotonic_ms() -> int:
    """Return the monotonic clock in milliseconds: a manager's default clock."""
    return time.monotonic_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class Timing:
    """The three windows of one manager, validated.

    Args:
        lock_duration: The lock TTL in milliseconds.
        lock_renew_time: Longest time between two renewals of one lock, in
            milliseconds; ``lock_duration // 2`` when ``None``.

    Raises:
        TypeError: A duration is not an ``int``.
        ValueError: A duration is not positive or above
            :data:`~actors.validation.MAX_DURATION_MS`, ``lock_renew_time`` is
            not below ``lock_duration``, or the timer interval
            (``lock_renew_time // 2``) would be under 1 ms.
    """

    #: The lock TTL, in milliseconds.
    lock_duration: int = DEFAULT_LOCK_DURATION
    #: Longest time between two renewals of one lock, in milliseconds.
    lock_renew_time: int | None = None

    def __post_init__(self) -> None:
        duration = require_int(self.lock_duration, "lock_duration", maximum=MAX_DURATION_MS)
        renew = self.lock_renew_time
        if renew is None:
            duration = require_int(duration, "lock_duration", minimum=4)
            renew = duration // 2
        renew = require_int(renew, "lock_renew_time", maximum=MAX_DURATION_MS)
        # The plain ints the checks return, never a caller's int subclass.
        object.__setattr__(self, "lock_duration", duration)
        object.__setattr__(self, "lock_renew_time", renew)
        if renew >= duration:
            raise ValueError(
                f"lock_renew_time must be below lock_duration ({duration}), got {renew}"
            )
        if renew // 2 < 1:
            raise ValueError(
                f"lock_renew_time must be at least 2 ms (the timer interval is "
                f"lock_renew_time // 2), got {renew}"
            )

    @property
    def renew_time(self) -> int:
        """``lock_renew_time`` resolved, in milliseconds."""
        assert self.lock_renew_time is not None
        return self.lock_renew_time

    @property
    def interval(self) -> int:
        """Time between two ticks of the timer, in milliseconds."""
        return self.renew_time // 2

    @property
    def threshold(self) -> int:
        """Age of a renewal after which a job is due again, in milliseconds."""
        return self.renew_time // 2

    @property
    def worst_gap(self) -> int:
        """Longest time between two renewal attempts of a job, in milliseconds.

        A job renewed just after a tick is not due at the next tick (the
        comparison is strict) but is at the one after: two intervals, plus
        however late the second tick runs.
        """
        return self.interval + self.threshold

    @property
    def margin(self) -> int:
        """Time a lock has left at the latest renewal attempt, in milliseconds."""
        return self.lock_duration - self.worst_gap


def default_safety_margin(timing: Timing) -> int:
    """Return the default ``safety_margin`` for ``timing``: half the timer interval (ms).

    A watched lock is trusted until ``lock_duration - safety_margin`` after
    the last renewal the server confirmed was sent. A watched lock is renewed
    at every tick, so with the default windows (``lock_duration`` four
    intervals) three renewals, each given a quarter of the interval by the
    manager's own client (its command timeout), fit before the deadline, and
    the half interval left covers the timer's lateness (milliseconds) and
    the job's reaction to the news, before the server can expire the lock.

    Args:
        timing: The manager's windows.
    """
    return timing.interval // 2


def check_safety_margin(
    safety_margin: object, timing: Timing, argument: str = "safety_margin"
) -> int:
    """Return ``safety_margin`` (ms) as a plain ``int`` if a watched lock can live with it.

    The margin must leave at least one timer interval between a renewal's
    send and the deadline it earns, or a watched lock would be declared
    ``"unconfirmed"`` before its next renewal could be confirmed.

    Args:
        safety_margin: The margin to check, in milliseconds.
        timing: The manager's windows.
        argument: The argument's name, for the error.

    Raises:
        TypeError: ``safety_margin`` is not an ``int``.
        ValueError: It is negative, or not below ``lock_duration`` minus the
            timer interval.
    """
    margin = require_int(safety_margin, argument, minimum=0, maximum=MAX_DURATION_MS)
    most = timing.lock_duration - timing.interval
    if margin >= most:
        raise ValueError(
            f"{argument} must be below lock_duration - interval ({timing.lock_duration} - "
            f"{timing.interval} = {most} ms), got {margin}: a watched lock would be "
            f"declared unconfirmed before its next renewal could be confirmed"
        )
    return margin


def check_lock_duration(lock_duration: int) -> None:
    """Refuse a lock TTL too short to be meant for a Redis lock.

    :class:`Timing` accepts any duration from 4 ms, for a manager driven by a
    test's clock and lock table; a manager renewing on a Redis server checks
    this too.

    Args:
        lock_duration: The lock TTL, an ``int`` already checked by :class:`Timing`.

    Raises:
        ValueError: ``lock_duration`` is under :data:`MIN_REDIS_LOCK_DURATION`.
    """
    if lock_duration >= MIN_REDIS_LOCK_DURATION:
        return
    timing = Timing(max(lock_duration, 4))
    raise ValueError(
        f"lock_duration is in milliseconds: {lock_duration} would make each lock "
        f"{lock_duration} ms long, renewed by a tick every {timing.interval} ms; for "
        f"{lock_duration} seconds pass lock_duration={lock_duration * 1000} (locks under "
        f"{MIN_REDIS_LOCK_DURATION} ms are refused: no pause of the process or the server "
        f"can fit in their margin)"
    )


def due_mask(stamps: Mapping[str, int], now: int, threshold: int) -> list[bool]:
    """Return, for each job in the mapping's order, whether it is due: ``ts + threshold < now``.

    The mask picks the due entries out of any mapping kept in the same order
    (``itertools.compress``): ids and their tokens in one pass each, without a
    lookup per job.

    Args:
        stamps: Each tracked job's ``ts``: the monotonic time, in
            milliseconds, of its tracking or of its last renewal.
        now: The current monotonic time, in milliseconds.
        threshold: Age in milliseconds after which a job is due.
    """
    # Integers: ts + threshold < now exactly when ts < now - threshold.
    cutoff = now - threshold
    return [ts < cutoff for ts in stamps.values()]


def select_due(stamps: Mapping[str, int], now: int, threshold: int) -> list[str]:
    """Return the ids of the jobs due for renewal: ``ts + threshold < now``.

    Args:
        stamps: Each tracked job's ``ts`` (see :func:`due_mask`).
        now: The current monotonic time, in milliseconds.
        threshold: Age in milliseconds after which a job is due.

    Returns:
        The due ids, in the mapping's order.
    """
    return list(compress(stamps, due_mask(stamps, now, threshold)))


def next_deadline(previous: int, interval: int, now: int) -> int:
    """Return the next tick time on the grid ``previous + k * interval``.

    Ticks stay on a fixed grid so a slow tick does not push every later one
    back. A tick that overran whole intervals does not fire the grid times it
    missed in a burst: the next tick is the latest grid time already past
    (it fires at once, less than one interval late), so no job waits longer
    than ``lock_renew_time`` plus that tick's lateness.

    Args:
        previous: The grid time of the tick that just ran.
        interval: The timer interval, in milliseconds.
        now: The current time, on the same clock.
    """
    missed = (now - previous) // interval
    return previous + max(missed, 1) * interval
