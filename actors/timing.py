"""The timing rules of lock renewal, and the one rule per kind of argument, as pure functions.

Three windows, all in milliseconds:

- ``lock_duration``: the lock's TTL (default 30000);
- ``lock_renew_time``: how often each lock is renewed at the latest
  (default ``lock_duration // 2``);
- the timer interval and the due threshold, both ``lock_renew_time // 2``.

A job is due when ``ts + threshold < now``, strictly. With interval equal to
threshold, a job is renewed every one or two ticks, so it waits at most
``lock_renew_time`` (plus one tick's delay) between renewals, well inside its
``lock_duration``.

Every door into a manager checks its arguments with the ``require_*``
functions here, so bad input fails at the caller, naming the argument.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass
from itertools import compress
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = [
    "DEFAULT_LOCK_DURATION",
    "MAX_DURATION_MS",
    "MAX_TEXT_BYTES",
    "MIN_REDIS_LOCK_DURATION",
    "Timing",
    "check_lock_duration",
    "check_safety_margin",
    "default_safety_margin",
    "due_mask",
    "is_valid_text",
    "monotonic_ms",
    "next_tick",
    "require_callback",
    "require_int",
    "require_text",
    "resolution_ms",
    "select_due",
    "yield_interpreter",
]

#: Default lock TTL, in milliseconds, as every EchoMQ and BullMQ runtime uses.
DEFAULT_LOCK_DURATION = 30000

#: Shortest lock a manager sets on a Redis server, in milliseconds. Below it
#: the lock's headroom is shorter than one ordinary pause of the process or
#: the server, and the value is likely seconds typed for milliseconds.
MIN_REDIS_LOCK_DURATION = 100

#: Longest duration a manager accepts, in milliseconds (about 24.8 days): the
#: longest delay Node.js timers, and so BullMQ peers, can wait.
MAX_DURATION_MS = 2**31 - 1

#: Longest job id or token, in UTF-8 bytes, so that one huge id cannot fail
#: the script call that renews the jobs beside it.
MAX_TEXT_BYTES = 65536


def is_valid_text(value: object) -> bool:
    """Whether ``value`` passes :func:`require_text`, without raising."""
    if type(value) is not str or not value:
        return False
    if value.isascii():
        return len(value) <= MAX_TEXT_BYTES
    try:
        return len(value.encode("utf-8")) <= MAX_TEXT_BYTES
    except UnicodeEncodeError:
        return False


def require_text(value: object, argument: str) -> str:
    """Return ``value`` as a plain ``str`` if it is a non-empty one that encodes as UTF-8.

    Lock keys and tokens are UTF-8 on every runtime, so a lone surrogate could
    never name a lock. A ``str`` subclass is copied to a plain ``str``: what
    the manager keeps must not run a caller's methods on its thread.

    Raises:
        TypeError: ``value`` is not a ``str``.
        ValueError: ``value`` is empty, longer than :data:`MAX_TEXT_BYTES`
            bytes, or not encodable as UTF-8.
    """
    if is_valid_text(value):
        return value  # type: ignore[return-value]
    if not isinstance(value, str):
        raise TypeError(f"{argument} must be a str, got {type(value).__name__}")
    # str's own __str__ copies a subclass's characters, calling none of its methods.
    value = str.__str__(value)
    if is_valid_text(value):
        return value
    if not value:
        raise ValueError(f"{argument} must not be empty")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"{argument} must encode as UTF-8, got {value!r} ({exc.reason} at {exc.start})"
        ) from None
    raise ValueError(f"{argument} must be at most {MAX_TEXT_BYTES} bytes, got {size}")


def require_int(
    value: object, argument: str, *, minimum: int = 1, maximum: int | None = None
) -> int:
    """Return ``value`` as a plain ``int`` if it is an ``int`` (not a ``bool``) within the bounds.

    An ``int`` subclass (an ``IntEnum``, say) is copied to a plain ``int``, as
    :func:`require_text` does for ``str``.

    Raises:
        TypeError: ``value`` is not an ``int``.
        ValueError: ``value`` is below ``minimum`` or above ``maximum``.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{argument} must be an int, got {type(value).__name__}")
    # int's own __index__ copies a subclass's value, calling none of its methods.
    value = int.__index__(value)
    if value < minimum:
        floor = "positive" if minimum == 1 else f"at least {minimum}"
        raise ValueError(f"{argument} must be {floor}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{argument} must be at most {maximum}, got {value}")
    return value


def require_callback(value: Any, argument: str) -> None:
    """Check that ``value`` is callable or ``None``.

    Raises:
        TypeError: It is neither.
    """
    if value is not None and not callable(value):
        raise TypeError(f"{argument} must be callable or None, got {type(value).__name__}")


def yield_interpreter() -> None:
    """Let any other thread waiting for the interpreter run now."""
    time.sleep(0)


def monotonic_ms() -> int:
    """Return the monotonic clock in milliseconds: a manager's default clock."""
    return time.monotonic_ns() // 1_000_000


def resolution_ms() -> int:
    """Return how late a thread timer's fire may run with nothing wrong, in milliseconds.

    One for the clock's whole milliseconds, plus the interpreter's switch
    interval (``sys.getswitchinterval()``) a woken thread may wait for its turn.
    """
    return 1 + math.ceil(sys.getswitchinterval() * 1000)


@dataclass(frozen=True, slots=True)
class Timing:
    """The three windows of one manager, validated.

    Raises:
        TypeError: A duration is not an ``int``.
        ValueError: A duration is not positive or above
            :data:`MAX_DURATION_MS`, ``lock_renew_time`` is not below
            ``lock_duration``, or the timer interval (``lock_renew_time // 2``)
            would be under 1 ms.
    """

    #: The lock TTL, in milliseconds.
    lock_duration: int = DEFAULT_LOCK_DURATION
    #: Longest time between two renewals of one lock, in milliseconds;
    #: ``lock_duration // 2`` when ``None``.
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
    def headroom(self) -> int:
        """TTL a plain lock has left at its latest renewal attempt, in milliseconds."""
        return self.lock_duration - self.worst_gap


def default_safety_margin(timing: Timing) -> int:
    """Return the default ``safety_margin`` for ``timing``: half the timer interval (ms).

    A watched lock is trusted until ``lock_duration - safety_margin`` after
    the last confirmed renewal's send; the half interval covers the timer's
    lateness and the job's reaction before the server can expire the lock.
    """
    return timing.interval // 2


def check_safety_margin(
    safety_margin: object, timing: Timing, argument: str = "safety_margin"
) -> int:
    """Return ``safety_margin`` (ms) as a plain ``int`` if a watched lock can live with it.

    It must leave a timer interval between a renewal's send and the deadline
    it earns, or a watched lock would be ``"unconfirmed"`` before its next renewal.

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

    :class:`Timing` accepts any duration from 4 ms (a test's clock and lock
    table); a manager renewing on a Redis server checks this too.

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
    (``itertools.compress``), without a lookup per job. All times are in
    monotonic milliseconds.
    """
    # Integers: ts + threshold < now exactly when ts < now - threshold.
    cutoff = now - threshold
    return [ts < cutoff for ts in stamps.values()]


def select_due(stamps: Mapping[str, int], now: int, threshold: int) -> list[str]:
    """Return the ids of the jobs due (``ts + threshold < now``), in the mapping's order."""
    return list(compress(stamps, due_mask(stamps, now, threshold)))


def next_tick(previous: int, interval: int, now: int) -> int:
    """Return the next tick time on the grid ``previous + k * interval``.

    Ticks stay on a fixed grid so a slow tick does not push every later one
    back. A tick that overran whole intervals does not fire the grid times it
    missed in a burst: the next tick is the latest grid time already past
    (it fires at once, less than one interval late), so no job waits longer
    than ``lock_renew_time`` plus that tick's lateness.
    """
    missed = (now - previous) // interval
    return previous + max(missed, 1) * interval
