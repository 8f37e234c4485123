"""The manager's one timer, and the seam through which a test or a host drives it.

A manager holds exactly one :class:`Timer`. It arms it with the grid time of
its next tick; when that time comes the timer calls ``fire(scheduled)``, which
tells the manager ``ExtendLocks(scheduled)``. The manager renews, then arms the
timer again. Nothing else ever arms it, so a "renew now" sent by a user leaves
the grid alone.
"""

from __future__ import annotations

import logging
import math
import sys
import threading
from collections.abc import Callable
from typing import Protocol

import pykka

from actors.schedule import monotonic_ms

__all__ = ["ManualTimer", "ThreadTimer", "Timer", "TimerFactory", "resolution_ms"]

logger = logging.getLogger(__name__)


def resolution_ms() -> int:
    """Return how late a :class:`ThreadTimer`'s fire may run with nothing wrong, in milliseconds.

    The clock counts whole milliseconds (one), and a woken thread may wait up
    to the interpreter's switch interval (``sys.getswitchinterval()``, 5 ms by
    default) for its turn while another thread runs Python code. Lateness
    within this says nothing about the process.
    """
    return 1 + math.ceil(sys.getswitchinterval() * 1000)


class Timer(Protocol):
    """One pending fire at a time, on the manager's clock."""

    def arm(self, deadline_ms: int) -> None:
        """Fire once at ``deadline_ms``; replaces the pending fire, if any."""
        ...

    def close(self) -> None:
        """Disarm for good; nothing fires after this returns."""
        ...


#: Builds a manager's timer from the function to call when it fires (with the
#: deadline it was armed for) and a name for its thread.
TimerFactory = Callable[[Callable[[int], None], str], Timer]


#: Seconds the timer waits before reading a clock that raised again.
CLOCK_RETRY_S = 0.01


class ThreadTimer:
    """A timer on one thread of its own, kept for the manager's whole life.

    One thread however many jobs are tracked and however often it fires, so
    the thread count stays constant.

    Args:
        fire: Called with the deadline, on the timer's thread, when it comes.
        name: The thread's name.
        clock: The clock deadlines are on, in milliseconds; it must advance
            with real time (the default is the monotonic clock).
    """

    def __init__(
        self,
        fire: Callable[[int], None],
        name: str,
        clock: Callable[[], int] = monotonic_ms,
    ) -> None:
        self._fire = fire
        self._clock = clock
        self._cond = threading.Condition()
        self._deadline: int | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def arm(self, deadline_ms: int) -> None:
        """Fire once at ``deadline_ms``; replaces the pending fire, if any."""
        with self._cond:
            self._deadline = deadline_ms
            self._cond.notify()

    def close(self) -> None:
        """Disarm and end the thread; nothing fires after this returns."""
        with self._cond:
            self._closed = True
            self._deadline = None
            self._cond.notify()
        if threading.current_thread() is not self._thread:
            self._thread.join()

    def _run(self) -> None:
        with self._cond:
            while not self._closed:
                deadline = self._deadline
                if deadline is None:
                    self._cond.wait()
                    continue
                try:
                    remaining = deadline - self._clock()
                except Exception:
                    # A user clock is a user callback: ask it again shortly.
                    logger.exception("%s: the clock raised", self._thread.name)
                    self._cond.wait(CLOCK_RETRY_S)
                    continue
                if remaining > 0:
                    self._cond.wait(remaining / 1000)
                    continue
                self._deadline = None
                try:
                    self._fire(deadline)
                except pykka.ActorDeadError:
                    return  # the manager is gone: nothing left to tick
                except Exception:
                    # Anything else is a fault of one fire: the manager is
                    # alive, so say so and keep the timer.
                    logger.exception("%s: a timer fire failed", self._thread.name)


class ManualTimer:
    """A timer that never fires by itself: the caller decides when ticks happen.

    For tests and for hosts with a scheduler of their own. Read
    :attr:`deadline` and send ``ExtendLocks(scheduled=timer.deadline)`` (with
    ``ask``, to wait for the tick) when that time has come on the clock the
    manager was given.

    Args:
        fire: Ignored; present to fit :data:`TimerFactory`.
        name: Ignored.
    """

    def __init__(self, fire: Callable[[int], None] | None = None, name: str = "") -> None:
        #: The pending deadline, or ``None``.
        self.deadline: int | None = None
        #: How many times the manager armed it.
        self.armed = 0
        #: Whether the manager closed it.
        self.closed = False

    def arm(self, deadline_ms: int) -> None:
        """Record ``deadline_ms`` as the pending deadline."""
        self.deadline = deadline_ms
        self.armed += 1

    def close(self) -> None:
        """Forget the deadline."""
        self.deadline = None
        self.closed = True
